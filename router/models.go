package router

import (
	"encoding/json"
	"slices"

	"github.com/valyala/fasthttp"
)

// modelInfo is one model of GET /v1/models, in OpenAI's shape.
type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Attribution is the credit the served voices' licences ask for (tts.Description.Attribution),
	// on GET /v1/models' entries; absent for none.
	Attribution string `json:"attribution,omitempty"`
}

// models answers GET /v1/models (the served model, then its aliases, which reach the same
// model) and GET /v1/models/{id}.
func (s *Server) models(ctx *fasthttp.RequestCtx, id string) {
	m := s.o.Pool.Model()
	created := s.started.Unix()
	list := []modelInfo{{ID: m.Name, Object: "model", Created: created, OwnedBy: "voxmux", Attribution: m.Attribution}}
	for _, a := range s.o.ModelAliases {
		list = append(list, modelInfo{ID: a, Object: "model", Created: created, OwnedBy: "voxmux", Attribution: m.Attribution})
	}
	var body any = struct {
		Object string      `json:"object"`
		Data   []modelInfo `json:"data"`
	}{"list", list}
	if id != "" {
		i := slices.IndexFunc(list, func(x modelInfo) bool { return x.ID == id })
		if i < 0 {
			e := newError(fasthttp.StatusNotFound, "invalid_request_error", "model_not_found", "model "+id+" is not served here")
			p := "model"
			e.Param = &p
			writeError(ctx, e)
			return
		}
		body = list[i]
	}
	b, _ := json.Marshal(body)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// audioModels answers GET /v1/audio/models, the list TTS clients such as Open WebUI read to offer
// a model: "models", [{"id","name"}], beside the OpenAI-style "data" of GET /v1/models.
func (s *Server) audioModels(ctx *fasthttp.RequestCtx) {
	m := s.o.Pool.Model()
	created := s.started.Unix()
	ids := append([]string{m.Name}, s.o.ModelAliases...)
	body := struct {
		Object string       `json:"object"`
		Data   []modelInfo  `json:"data"`
		Models []namedEntry `json:"models"`
	}{Object: "list", Data: make([]modelInfo, len(ids)), Models: make([]namedEntry, len(ids))}
	for i, id := range ids {
		body.Data[i] = modelInfo{ID: id, Object: "model", Created: created, OwnedBy: "voxmux"}
		body.Models[i] = namedEntry{ID: id, Name: id}
	}
	b, _ := json.Marshal(body)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
