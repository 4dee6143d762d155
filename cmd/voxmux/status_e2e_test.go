package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// The status page in a real browser: headless Chromium (Debian's chromium package) loads it from
// the real server, an API key is typed, then text; Speak plays what came back. The audio element
// must hold audio of the length the same text gives as pcm (±10%), in each format tried.
func TestStatusPageInChromium(t *testing.T) {
	needCommand(t, "chromium")
	chromium, _ := exec.LookPath("chromium")

	listen := freePort(t)
	cfg := writeConfig(t, listen, "  - name: cpu\n    instances: 1\n")
	appendConfig(t, cfg, "api_keys:\n  env: VOXMUX_PAGE_KEYS\n")
	const key = "sk-page-test-91c"
	s := startServe(t, cfg, listen, "VOXMUX_PAGE_KEYS="+key)

	const text = "Hello from a real browser."
	resp, pcm := speechReq(t, s.url, key, `{"input":"`+text+`","response_format":"pcm"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("pcm: %d %s", resp.StatusCode, pcm)
	}
	want := float64(len(pcm)) / 2 / 24000

	bctx := openPage(t, chromium, s.url)
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	if visible, err := chromedp.Run(bctx, chromedp.Evaluate[bool](keyFieldShown)); err != nil || !visible {
		t.Fatalf("API keys are on but the page shows no key field (%v)", err)
	}
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(css("#key"), key+kb.Tab),
		chromedp.WaitReady(css("#voice option")),
		chromedp.Clear(css("#text")),
		chromedp.SendKeys(css("#text"), text),
	); err != nil {
		t.Fatalf("type the key and the text: %v", err)
	}
	voices, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#voice option")].map(o => o.value)`))
	if err != nil || len(voices) == 0 || voices[0] != "default" {
		t.Fatalf("voices %v %v", voices, err)
	}

	for _, format := range []string{"mp3", "opus", "wav", "pcm"} {
		err := chromedp.Do(bctx, chromedp.SetValue(css("#format"), format), chromedp.Click(css("#speak")))
		if err == nil {
			_, err = chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("audio").dataset.state !== "loading"`, chromedp.WithPollingTimeout(30*time.Second)))
		}
		if err != nil {
			t.Fatalf("%s: speak: %v", format, err)
		}
		state, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("audio").dataset.state`))
		result, _ := chromedp.Run(bctx, chromedp.Text(css("#result")))
		if state != "loaded" {
			t.Fatalf("%s: the page says %q", format, result)
		}
		// The browser has decoded the audio's header once loadedmetadata fired.
		duration, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`new Promise((resolve, reject) => {
			const a = document.getElementById("audio");
			const done = () => a.error ? reject(new Error("media error " + a.error.code)) : resolve(a.duration);
			if (a.readyState >= 1 && isFinite(a.duration)) return done();
			a.addEventListener("loadedmetadata", done, { once: true });
			a.addEventListener("durationchange", () => { if (isFinite(a.duration)) done(); });
			a.addEventListener("error", done, { once: true });
		})`, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("%s: the audio element did not load: %v (page: %q)", format, err, result)
		}
		if duration < 0.9*want || duration > 1.1*want {
			t.Errorf("%s: the audio element holds %.3f s, want %.3f s ±10%% (page: %q)", format, duration, want, result)
		}
		t.Logf("%s: %.3f s in the browser (pcm: %.3f s); %s", format, duration, want, result)
	}

	// The status part of the page shows the group and the requests just made.
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.querySelectorAll("#recent tbody tr").length >= 5`, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("recent requests table: %v", err)
	}
	group, err := chromedp.Run(bctx, chromedp.Text(css("#groups tbody")))
	if err != nil || !strings.Contains(group, "cpu") || !strings.Contains(group, "ready") {
		t.Errorf("groups table %q %v", group, err)
	}
	if p := os.Getenv("VOXMUX_STATUS_SCREENSHOT"); p != "" {
		if png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100)); err == nil {
			os.WriteFile(p, png, 0o644)
		}
	}
}

// keyFieldShown is true when the page lays out the API key field: what a person sees, not only
// the hidden attribute (a stylesheet's display rule can override it).
const keyFieldShown = `(el => el.getClientRects().length > 0 && getComputedStyle(el).display !== "none")(document.getElementById("key-label"))`

// openPage loads the status page at url in headless Chromium and waits until it has read
// /status.json; the browser closes with the test.
func openPage(t *testing.T, chromium, url string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("autoplay-policy", "no-user-gesture-required"),
		chromedp.WindowSize(1100, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	var console strings.Builder
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(func(f string, a ...any) { fmt.Fprintf(&console, f+"\n", a...) }))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("browser log:\n%s", console.String())
		}
		cancelBrowser()
		cancelAlloc()
	})
	if err := chromedp.Do(bctx,
		chromedp.Navigate(url+"/"),
		chromedp.WaitReady(chromedp.CSS(`body[data-ready="true"]`)),
	); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	return bctx
}

// Without API keys the page shows no key field, as a person sees it.
func TestStatusPageHidesKeyFieldWithoutKeys(t *testing.T) {
	needCommand(t, "chromium")
	chromium, _ := exec.LookPath("chromium")
	listen := freePort(t)
	s := startServe(t, writeConfig(t, listen, "  - name: cpu\n    instances: 1\n"), listen)
	bctx := openPage(t, chromium, s.url)
	shown, err := chromedp.Run(bctx, chromedp.Evaluate[bool](keyFieldShown))
	if err != nil || shown {
		t.Fatalf("no API keys are configured but the page shows a key field (%v)", err)
	}
}

// Serving the jenny voice, the page credits it as its dataset's licence asks: "Jenny (Dioco)",
// where audio is made; /status.json carries the same credit.
func TestStatusPageShowsVoiceAttribution(t *testing.T) {
	needCommand(t, "chromium")
	chromium, _ := exec.LookPath("chromium")
	voice := fetchJenny(t)
	listen := freePort(t)
	s := startServe(t, writePiperConfig(t, listen, voice), listen)
	bctx := openPage(t, chromium, s.url)
	credit, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#attribution")))
	if err != nil || !strings.Contains(credit, "Jenny (Dioco)") {
		t.Fatalf("the page's attribution is %q (%v), want it to call the voice \"Jenny (Dioco)\"", credit, err)
	}
	t.Logf("the page shows %q", credit)
}
