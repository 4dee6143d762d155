package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// CORS lets browser apps on other origins call /v1/*.
type CORS struct {
	// AllowOrigins are the origins ("https://app.example.com") whose pages may call the API, or
	// ["*"] for any. Left out: ["*"] (the API carries no cookies, and keys travel in a header a
	// page must hold already). An empty list turns CORS off: no CORS headers, and a preflight
	// gets 405.
	AllowOrigins *[]string `yaml:"allow_origins"`
	// MaxAge is how long a browser may cache a preflight's answer; default 10m.
	MaxAge Duration `yaml:"max_age"`
}

// DefaultCORSMaxAge is how long browsers cache a preflight unless cors.max_age says otherwise.
const DefaultCORSMaxAge = 10 * time.Minute

// Origins are the allowed origins: allow_origins, or ["*"] when the key is left out; empty
// when CORS is off.
func (c CORS) Origins() []string {
	if c.AllowOrigins == nil {
		return []string{"*"}
	}
	return append([]string{}, (*c.AllowOrigins)...)
}

func (c *Config) applyHTTPDefaults() {
	if c.CORS.MaxAge == 0 {
		c.CORS.MaxAge = Duration(DefaultCORSMaxAge)
	}
}

func (c *Config) validateHTTP() error {
	if c.CORS.MaxAge < 0 {
		return bad("$.cors.max_age", "cors.max_age", "must not be negative")
	}
	if c.CORS.AllowOrigins == nil {
		return nil
	}
	list := *c.CORS.AllowOrigins
	seen := map[string]bool{}
	for i, o := range list {
		p := fmt.Sprintf("$.cors.allow_origins[%d]", i)
		k := fmt.Sprintf("cors.allow_origins[%d]", i)
		if o == "*" {
			if len(list) > 1 {
				return bad(p, k, `"*" allows every origin and must be the only entry`)
			}
			continue
		}
		if err := checkOrigin(o); err != nil {
			return bad(p, k, "%q %s", o, err)
		}
		if seen[o] {
			return bad(p, k, "%q is listed twice", o)
		}
		seen[o] = true
	}
	return nil
}

// checkOrigin accepts an origin as browsers send it: scheme://host[:port], nothing more.
func checkOrigin(o string) error {
	u, err := url.Parse(o)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("is not an origin like https://app.example.com")
	}
	if u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("is not an origin: no path, query or user part (like https://app.example.com)")
	}
	if u.Scheme != strings.ToLower(u.Scheme) || u.Host != strings.ToLower(u.Host) {
		return fmt.Errorf("must be lower case, as browsers send it")
	}
	return nil
}
