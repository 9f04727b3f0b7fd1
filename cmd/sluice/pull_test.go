package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/hub/hubtest"
)

const tinyQwen3 = "../../../shared/models/tiny-qwen3-moe"

// sluiceEnv runs the binary with extra environment and returns stdout,
// stderr and the exit code.
func sluiceEnv(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if x, ok := err.(*exec.ExitError); ok {
		code = x.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// TestPullAndRunFromHub pulls the shared tiny model from a fake hub that
// drops connections and rate-limits, packs it, and runs it by its
// repository name: the tokens equal those of the same checkpoint given as
// a directory, and the second use downloads nothing. A missing repository
// is a clear error.
func TestPullAndRunFromHub(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	if err := h.AddDir("tiny/qwen3-moe", tinyQwen3); err != nil {
		t.Skipf("the shared tiny model is missing: %v", err)
	}
	h.DropAfter["model-00002-of-00004.safetensors"], h.Drops["model-00002-of-00004.safetensors"] = 1<<20, 1
	h.RateLimit = 1
	cache := t.TempDir()
	env := []string{"SLUICE_CACHE=" + cache, "HF_ENDPOINT=" + h.URL, "HF_TOKEN="}

	out, errOut, code := sluiceEnv(t, env, "pull", "tiny/qwen3-moe")
	if code != 0 {
		t.Fatalf("pull: exit %d\n%s", code, errOut)
	}
	packed := strings.TrimSpace(out)
	if _, err := os.Stat(filepath.Join(packed, "manifest.json")); err != nil {
		t.Fatalf("pull printed %q, not a packed model: %v\n%s", out, err, errOut)
	}
	h.Mu.Lock()
	h.Requests = nil
	h.Mu.Unlock()
	run := []string{"run", "-p", "def add(a, b):", "-n", "12", "--temp", "0", "--json", "--threads", "1"}
	got, errOut, code := sluiceEnv(t, env, append(run, "-m", "tiny/qwen3-moe")...)
	if code != 0 {
		t.Fatalf("run -m tiny/qwen3-moe: exit %d\n%s", code, errOut)
	}
	want, errOut, code := sluiceEnv(t, env, append(run, "-m", tinyQwen3)...)
	if code != 0 {
		t.Fatalf("run -m %s: exit %d\n%s", tinyQwen3, code, errOut)
	}
	tokens := func(s string) string {
		var r struct {
			Tokens []int `json:"tokens"`
		}
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			t.Fatalf("run --json printed %q: %v", s, err)
		}
		return fmt.Sprint(r.Tokens)
	}
	if tokens(got) != tokens(want) || tokens(got) == "[]" {
		t.Errorf("pulled model gave %s; the checkpoint directory gave %s", got, want)
	}
	if len(h.Requests) != 0 {
		t.Errorf("a second use reached the hub: %v", h.Requests)
	}

	_, errOut, code = sluiceEnv(t, env, "pull", "nobody/nothing")
	if code != 1 || !strings.Contains(errOut, "repository nobody/nothing not found") || !strings.Contains(errOut, "HF_TOKEN") {
		t.Errorf("missing repository: exit %d\n%s", code, errOut)
	}
	_, errOut, code = sluiceEnv(t, env, "run", "-m", "nobody/nothing", "-p", "x")
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("run -m of a missing repository: exit %d\n%s", code, errOut)
	}
}

// TestPullInterrupted sends SIGINT to a pull midway: it exits 130 saying
// where the partial downloads are, nothing is packed, and the same command
// then resumes and finishes.
func TestPullInterrupted(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	if err := h.AddDir("tiny/qwen3-moe", tinyQwen3); err != nil {
		t.Skipf("the shared tiny model is missing: %v", err)
	}
	h.Delay = 5 * time.Millisecond
	cache := t.TempDir()
	env := []string{"SLUICE_CACHE=" + cache, "HF_ENDPOINT=" + h.URL}
	cmd := exec.Command(bin, "pull", "tiny/qwen3-moe")
	cmd.Env = append(os.Environ(), env...)
	var e bytes.Buffer
	cmd.Stderr = &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "hub", "tiny--qwen3-moe")
	deadline := time.Now().Add(20 * time.Second)
	for {
		parts, _ := filepath.Glob(filepath.Join(dir, "*.partial"))
		if len(parts) > 0 {
			if st, err := os.Stat(parts[0]); err == nil && st.Size() > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no partial download appeared\n%s", e.String())
		}
		time.Sleep(2 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	if x, ok := err.(*exec.ExitError); !ok || x.ExitCode() != 130 || !strings.Contains(e.String(), "partial downloads stay in") {
		t.Fatalf("interrupted pull: %v\n%s", err, e.String())
	}
	if packs, _ := filepath.Glob(filepath.Join(cache, "*-q4-*")); len(packs) != 0 {
		t.Fatalf("an interrupted pull left packed output: %v", packs)
	}
	h.Mu.Lock()
	h.Delay = 0
	h.Mu.Unlock()
	out, errOut, code := sluiceEnv(t, env, "pull", "tiny/qwen3-moe", "--no-pack")
	if code != 0 || strings.TrimSpace(out) != dir {
		t.Fatalf("resumed pull: exit %d, printed %q\n%s", code, out, errOut)
	}
	if !strings.Contains(strings.Join(h.Requests, "\n"), " bytes=") {
		t.Errorf("the second pull resumed nothing: %v", h.Requests)
	}
}
