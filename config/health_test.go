package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseHealthAndConsul(t *testing.T) {
	c, err := Parse(testFile, []byte(`
model: m.yaml
groups:
  - name: a
health:
  ignored_xids: [13, 43]
  max_temperature: 85
  poll_interval: 500ms
  recovery_passes: 5
  probe_interval: 3s
  restart_unhealthy: false
consul:
  enabled: true
  address: https://127.0.0.1:8501
  token_file: consul.token
  datacenter: dc2
  tls:
    ca_file: ca.pem
    cert_file: /etc/voxmux/client.pem
    key_file: /etc/voxmux/client-key.pem
    server_name: consul.local
  service: tts
  service_id: tts-a
  advertise: 10.0.0.7
  tags: [gpu, h100]
  check_interval: 1s
  check_timeout: 500ms
  deregister_critical_after: 2m
  group_service: tts-group
  reconcile_interval: 10s
`))
	if err != nil {
		t.Fatal(err)
	}
	no := false
	want := Health{IgnoredXids: []uint64{13, 43}, MaxTemperature: 85, PollInterval: Duration(500 * time.Millisecond),
		RecoveryPasses: 5, ProbeInterval: Duration(3 * time.Second), RestartUnhealthy: &no}
	if !reflect.DeepEqual(c.Health, want) {
		t.Errorf("health = %+v, want %+v", c.Health, want)
	}
	if c.Health.Restart() {
		t.Error("restart_unhealthy: false ignored")
	}
	wantC := Consul{Enabled: true, Address: "https://127.0.0.1:8501", TokenFile: "consul.token", Datacenter: "dc2",
		TLS:     ConsulTLS{CAFile: "ca.pem", CertFile: "/etc/voxmux/client.pem", KeyFile: "/etc/voxmux/client-key.pem", ServerName: "consul.local"},
		Service: "tts", ServiceID: "tts-a", Advertise: "10.0.0.7", Tags: []string{"gpu", "h100"},
		CheckInterval: Duration(time.Second), CheckTimeout: Duration(500 * time.Millisecond), DeregisterCriticalAfter: Duration(2 * time.Minute),
		GroupService: "tts-group", ReconcileInterval: Duration(10 * time.Second)}
	if !reflect.DeepEqual(c.Consul, wantC) {
		t.Errorf("consul = %+v\nwant %+v", c.Consul, wantC)
	}
	if got := c.Path(c.Consul.TLS.CAFile); got != "/etc/voxmux/ca.pem" {
		t.Errorf("Path(ca.pem) = %q", got)
	}
	if got := c.Path(c.Consul.TLS.CertFile); got != "/etc/voxmux/client.pem" {
		t.Errorf("Path(absolute) = %q", got)
	}

	// Left out: everything at its zero value, meaning the defaults; an empty list ignores no Xid.
	c, err = Parse(testFile, []byte("model: m.yaml\ngroups:\n  - name: a\nhealth:\n  ignored_xids: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Health.IgnoredXids == nil || len(c.Health.IgnoredXids) != 0 || !c.Health.Restart() || c.Consul.Enabled {
		t.Errorf("defaults: %+v %+v", c.Health, c.Consul)
	}
}

func TestParseHealthErrors(t *testing.T) {
	base := "model: m.yaml\ngroups:\n  - name: a\n"
	tests := []struct {
		yaml string
		want []string
	}{
		{"health:\n  max_temperature: -5\n", []string{testFile + ":5:", "health.max_temperature"}},
		{"health:\n  poll_interval: -1s\n", []string{testFile + ":5:", "health.poll_interval"}},
		{"health:\n  recovery_passes: -1\n", []string{testFile + ":5:", "health.recovery_passes"}},
		{"health:\n  probe_interval: -1s\n", []string{testFile + ":5:", "health.probe_interval"}},
		{"health:\n  ignored_xids: [x]\n", []string{testFile}},
		{"health:\n  bogus: 1\n", []string{`"bogus"`}},
		{"consul:\n  service: voxmux.tts\n", []string{testFile + ":5:", "consul.service", "DNS label"}},
		{"consul:\n  service: tts\n  group_service: tts\n", []string{testFile + ":6:", "consul.group_service"}},
		{"consul:\n  group_service: -x\n", []string{testFile + ":5:", "consul.group_service"}},
		{"consul:\n  check_interval: -2s\n", []string{testFile + ":5:", "consul.check_interval"}},
		{"consul:\n  tls:\n    cert_file: c.pem\n", []string{testFile + ":6:", "consul.tls", "key_file"}},
		{"consul:\n  token: x\n  token_file: y\n", []string{testFile + ":6:", "consul.token_file"}},
		{"consul:\n  tags: [a, \"\"]\n", []string{"consul.tags[1]", "empty"}},
		{"consul:\n  adress: x\n", []string{`"adress"`}},
	}
	for _, tt := range tests {
		_, err := Parse(testFile, []byte(base+tt.yaml))
		if err == nil {
			t.Errorf("%q: no error", tt.yaml)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q does not contain %q", tt.yaml, err, w)
			}
		}
	}
}
