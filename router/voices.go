package router

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// voiceList is the body of GET /v1/audio/voices, shaped like OpenAI's lists ({"object":"list",
// "data":[...]}). OpenAI's own voice names (alloy, ...) are accepted too and are not listed: they
// map to the first voice.
type voiceList struct {
	Object string      `json:"object"`
	Model  string      `json:"model"`
	Data   []voiceInfo `json:"data"`
}

type voiceInfo struct {
	ID     string `json:"id"`
	Object string `json:"object"`
}

// voices lists the voices the served model has, in the order the model gives them (the first is
// the default).
func (s *Server) voices(ctx *fasthttp.RequestCtx) {
	m := s.o.Pool.Model()
	l := voiceList{Object: "list", Model: m.Name, Data: make([]voiceInfo, len(m.Voices))}
	for i, v := range m.Voices {
		l.Data[i] = voiceInfo{ID: v, Object: "voice"}
	}
	body, _ := json.Marshal(l)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}
