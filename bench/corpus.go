package bench

import "unicode/utf8"

// Sentence is one benchmark input.
type Sentence struct {
	Lang string `json:"lang"` // en, zh, es
	Text string `json:"text"`
}

// Chars is the sentence's length in characters (Unicode code points), the unit of chars/s.
func (s Sentence) Chars() int { return utf8.RuneCountInString(s.Text) }

// Corpus is the fixed benchmark corpus: English, Chinese and Spanish, short, medium and long, in
// an order that mixes languages and lengths so that any run of consecutive requests (workers take
// sentences round-robin) has a similar mix. It never changes between runs, so reports compare.
var Corpus = []Sentence{
	{"en", "Good morning."},
	{"zh", "今天天气很好，我们去公园散步吧。"},
	{"es", "¿Dónde está la estación de tren más cercana?"},
	{"en", "The quick brown fox jumps over the lazy dog near the riverbank."},
	{"zh", "请在会议开始前十分钟到达，并把手机调成静音。"},
	{"es", "Mañana lloverá por la tarde, así que lleva un paraguas cuando salgas de casa."},
	{"en", "Please remember to water the plants on the balcony while I am away next week, and check the mailbox every other day."},
	{"zh", "好的。"},
	{"es", "Gracias."},
	{"en", "Your order has shipped and should arrive within three to five business days."},
	{"zh", "这家餐厅的招牌菜是红烧肉，味道很正宗，价格也不贵，周末常常需要排队。"},
	{"es", "El museo abre a las diez de la mañana y cierra a las seis de la tarde, excepto los lunes, cuando permanece cerrado por mantenimiento."},
	{"en", "Thank you!"},
	{"zh", "为了保证服务质量，本次通话可能会被录音，请问还有什么可以帮您的吗？"},
	{"es", "Hola, ¿cómo estás?"},
	{"en", "At the next intersection, turn left onto Maple Avenue, then continue straight for about two miles until you see the library on your right."},
	{"zh", "火车将于下午三点二十分从北京南站出发，预计晚上八点到达上海虹桥站，请提前检票。"},
	{"es", "La reunión se ha trasladado al jueves porque varios miembros del equipo están de viaje."},
	{"en", "How can I help you today?"},
	{"zh", "学习一门新语言需要耐心和坚持，每天练习一点点，几个月后你就会看到明显的进步。"},
	{"es", "Si necesitas ayuda con la instalación, llama a nuestro servicio técnico, que atiende todos los días de ocho a ocho, incluidos los festivos."},
	{"en", "The museum's new exhibition explores how ancient sailors navigated the open ocean using only the stars, the wind and the color of the water."},
	{"zh", "谢谢你的帮助。"},
	{"es", "El café de esta cafetería es excelente."},
	{"en", "Battery low."},
	{"zh", "根据最新的天气预报，明天上午有小雨，下午转晴，最高气温二十六度，最低气温十八度，适合户外活动。"},
	{"es", "Buenas noches a todos."},
	{"en", "If the package does not arrive by Friday, contact customer support with your tracking number and we will send a replacement at no extra cost."},
	{"zh", "他每天早上六点起床跑步。"},
	{"es", "Los resultados del estudio muestran que dormir bien mejora la memoria, la concentración y el estado de ánimo de los estudiantes."},
}
