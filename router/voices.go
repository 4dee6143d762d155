package router

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// voiceList is the body of GET /v1/audio/voices. It is shaped like OpenAI's lists ({"object":"list",
// "data":[...]}) and also carries "voices", [{"id","name"}], which is what Open WebUI reads (it
// ignores "data" and would show no voice without it). OpenAI's own voice names (alloy, ...) are
// accepted too and are not listed: they map to the first voice. Library voices follow the
// model's own, marked "type": "cloned": those the model can speak in (it clones, and its family
// made them).
type voiceList struct {
	Object string       `json:"object"`
	Model  string       `json:"model"`
	Data   []voiceInfo  `json:"data"`
	Voices []namedEntry `json:"voices"`
}

type voiceInfo struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Name   string `json:"name"`
	Type   string `json:"type"` // builtin or cloned
}

// namedEntry is an item of the lists Open WebUI reads ("voices", "models").
type namedEntry struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// voices lists the voices the served model has, in the order the model gives them (the first is
// the default).
func (s *Server) voices(ctx *fasthttp.RequestCtx) {
	m := s.o.Pool.Model()
	l := voiceList{Object: "list", Model: m.Name, Data: make([]voiceInfo, len(m.Voices)), Voices: make([]namedEntry, len(m.Voices))}
	for i, v := range m.Voices {
		l.Data[i] = voiceInfo{ID: v, Object: "voice", Name: v, Type: voiceBuiltin}
		l.Voices[i] = namedEntry{ID: v, Name: v}
	}
	if s.o.Voices != nil {
		for _, v := range s.o.Voices.List() {
			if !speaksIn(m, v) {
				continue
			}
			l.Data = append(l.Data, voiceInfo{ID: v.Name, Object: "voice", Name: v.Name, Type: voiceCloned})
			l.Voices = append(l.Voices, namedEntry{ID: v.Name, Name: v.Name})
		}
	}
	body, _ := json.Marshal(l)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}
