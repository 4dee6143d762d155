// Package voicemod fetches published Piper voices that come as Go modules and unpacks them into a
// folder of voice files under Piper's names, which `voxmux serve` reads (docs/piper.md).
//
// A voice module (github.com/amitybell/piper-voice-*) embeds dist.tzst, a zstd-compressed tar of
// voice.onnx, voice.json and MODEL_CARD. It is fetched with `go mod download`, so its checksum is
// verified against the checksum database as for any module and the Go module cache is the cache;
// nothing is compiled into voxmux.
package voicemod

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Known voice modules at pinned versions, by short name. Each voice's licence is its dataset's
// (the MODEL_CARD unpacked beside it points to it; docs/piper.md states them).
var Known = map[string]string{
	"jenny": "github.com/amitybell/piper-voice-jenny@v0.0.0-20231118093224-dcf0d49e46b7",
	"alan":  "github.com/amitybell/piper-voice-alan@v0.0.0-20231118093148-059963c24dbd",
}

// PiperBin is Piper's reference executable and its libraries (MIT), used by the parity tests.
const PiperBin = "github.com/amitybell/piper-bin-linux@v0.0.0-20250621082830-f5d5d85fa076"

// Module is what `go mod download -json` reports for one module.
type Module struct {
	Path    string
	Version string
	Dir     string // the module's files in the module cache (read-only)
	Sum     string
	Error   string
}

// Download fetches mod@version into the Go module cache with goBin (default "go") and returns
// where it is. The checksum is verified by the go command (GOSUMDB, GOFLAGS=-mod=mod so no go.mod
// is needed).
func Download(ctx context.Context, goBin, modVer string) (*Module, error) {
	if goBin == "" {
		goBin = "go"
	}
	if !strings.Contains(modVer, "@") {
		return nil, fmt.Errorf("module %q: want MODULE@VERSION (a pinned version)", modVer)
	}
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", modVer)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	cmd.Dir = os.TempDir() // outside any module, so no go.mod is read or written
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var m Module
	// go mod download -json reports a failed module as JSON with Error and exits 1.
	if err := json.Unmarshal(out, &m); err != nil {
		if runErr != nil {
			return nil, fmt.Errorf("go mod download %s: %w: %s", modVer, runErr, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("go mod download %s: reading its report: %w", modVer, err)
	}
	if m.Error != "" {
		return nil, fmt.Errorf("go mod download %s: %s", modVer, m.Error)
	}
	if runErr != nil {
		return nil, fmt.Errorf("go mod download %s: %w: %s", modVer, runErr, strings.TrimSpace(stderr.String()))
	}
	if m.Dir == "" {
		return nil, fmt.Errorf("go mod download %s: no module folder reported", modVer)
	}
	return &m, nil
}

// Resolve turns a short name from Known into MODULE@VERSION; anything else is returned as is.
func Resolve(name string) string {
	if mv, ok := Known[name]; ok {
		return mv
	}
	return name
}

// voiceConfig is the part of voice.json that names the voice as Piper's collection does.
type voiceConfig struct {
	Dataset  string `json:"dataset"`
	Language struct {
		Code string `json:"code"`
	} `json:"language"`
	Audio struct {
		Quality string `json:"quality"`
	} `json:"audio"`
}

// Unpacked is one voice written into a voices folder.
type Unpacked struct {
	Name      string // LANG_REGION-NAME-QUALITY
	ONNX      string // path of NAME.onnx (NAME.onnx.json beside it)
	ModelCard string // path of NAME.MODEL_CARD
}

// Unpack reads dist.tzst from a voice module's folder and writes NAME.onnx, NAME.onnx.json,
// NAME.MODEL_CARD and NAME.LICENSE (the module's licence) into dir, NAME being
// LANG_REGION-DATASET-QUALITY from voice.json (en_GB-jenny_dioco-medium). The files are written
// to a temporary folder in dir first and renamed into place, so a failed unpack leaves no partial
// voice behind.
func Unpack(m *Module, dir string) (*Unpacked, error) {
	fail := func(err error) (*Unpacked, error) {
		if m.Version == "" {
			return nil, fmt.Errorf("unpack %s: %w", m.Path, err)
		}
		return nil, fmt.Errorf("unpack %s@%s: %w", m.Path, m.Version, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp(dir, ".unpack-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	if err := extract(filepath.Join(m.Dir, "dist.tzst"), tmp); err != nil {
		return fail(err)
	}
	for _, f := range []string{"voice.onnx", "voice.json", "MODEL_CARD"} {
		if _, err := os.Stat(filepath.Join(tmp, f)); err != nil {
			return fail(fmt.Errorf("dist.tzst has no %s", f))
		}
	}
	data, err := os.ReadFile(filepath.Join(tmp, "voice.json"))
	if err != nil {
		return fail(err)
	}
	var c voiceConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return fail(fmt.Errorf("voice.json: %w", err))
	}
	if c.Language.Code == "" || c.Dataset == "" || c.Audio.Quality == "" {
		return fail(fmt.Errorf("voice.json: language.code %q, dataset %q, audio.quality %q: all three are needed to name the voice", c.Language.Code, c.Dataset, c.Audio.Quality))
	}
	name := c.Language.Code + "-" + c.Dataset + "-" + c.Audio.Quality
	if strings.ContainsAny(name, `/\`) || strings.HasPrefix(name, ".") {
		return fail(fmt.Errorf("voice.json names the voice %q, not a file name", name))
	}
	lic, err := os.ReadFile(filepath.Join(m.Dir, "LICENSE"))
	if err == nil {
		if err := os.WriteFile(filepath.Join(tmp, "LICENSE"), lic, 0o644); err != nil {
			return fail(err)
		}
	}
	u := &Unpacked{Name: name, ONNX: filepath.Join(dir, name+".onnx"), ModelCard: filepath.Join(dir, name+".MODEL_CARD")}
	// The graph goes last: a voice folder never holds an .onnx without its config.
	moves := [][2]string{{"MODEL_CARD", name + ".MODEL_CARD"}, {"voice.json", name + ".onnx.json"}, {"voice.onnx", name + ".onnx"}}
	if lic != nil {
		moves = append([][2]string{{"LICENSE", name + ".LICENSE"}}, moves...)
	}
	for _, mv := range moves {
		if err := os.Rename(filepath.Join(tmp, mv[0]), filepath.Join(dir, mv[1])); err != nil {
			return fail(err)
		}
	}
	return u, nil
}

// Fetch downloads a voice module (a short name from Known, or MODULE@VERSION) and unpacks it into dir.
func Fetch(ctx context.Context, goBin, voice, dir string) (*Unpacked, error) {
	m, err := Download(ctx, goBin, Resolve(voice))
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", voice, err)
	}
	u, err := Unpack(m, dir)
	if err != nil {
		return nil, fmt.Errorf("voice %s: %w", voice, err)
	}
	return u, nil
}

// Extract unpacks a zstd-compressed tar (dist.tzst) into dir: regular files, folders and symbolic
// links that stay inside dir.
func Extract(tzst, dir string) error { return extract(tzst, dir) }

func extract(tzst, dir string) error {
	f, err := os.Open(tzst)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", tzst, err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tzst, err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("%s: entry %q leaves the folder", tzst, h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := writeFile(p, tr, os.FileMode(h.Mode)&0o755|0o644); err != nil {
				return fmt.Errorf("%s: %s: %w", tzst, h.Name, err)
			}
		case tar.TypeSymlink:
			if !filepath.IsLocal(filepath.Join(filepath.Dir(name), h.Linkname)) {
				return fmt.Errorf("%s: link %q leaves the folder", tzst, h.Name)
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		}
	}
}

func writeFile(p string, r io.Reader, mode os.FileMode) error {
	out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// FetchPiper downloads Piper's reference executable (PiperBin) and unpacks it into dir; it returns
// the path of the piper executable (its libraries and espeak-ng-data are beside it).
func FetchPiper(ctx context.Context, goBin, dir string) (string, error) {
	m, err := Download(ctx, goBin, PiperBin)
	if err != nil {
		return "", err
	}
	if err := extract(filepath.Join(m.Dir, "dist.tzst"), dir); err != nil {
		return "", fmt.Errorf("unpack %s: %w", PiperBin, err)
	}
	exe := filepath.Join(dir, "piper")
	if err := os.Chmod(exe, 0o755); err != nil {
		return "", fmt.Errorf("unpack %s: %w", PiperBin, err)
	}
	return exe, nil
}
