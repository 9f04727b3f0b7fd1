package hub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelm/sluice/internal/hub/hubtest"
	"github.com/sluicelm/sluice/internal/platform"
)

const tinyDir = "../../../shared/models/tiny-qwen3-moe"

const shard = "model-00001-of-00004.safetensors"

func fakeHub(t *testing.T) *hubtest.Hub {
	t.Helper()
	h := hubtest.New()
	t.Cleanup(h.Close)
	if err := h.AddDir("tiny/qwen3-moe", tinyDir); err != nil {
		t.Skipf("the shared tiny model is missing: %v", err)
	}
	return h
}

func client(h *hubtest.Hub) *Client {
	return &Client{Endpoint: h.URL, Parallel: 3, backoff: func(int) time.Duration { return time.Millisecond }}
}

// sameFiles checks that dir holds exactly the files of want, byte for
// byte, and nothing partial.
func sameFiles(t *testing.T, dir, want string) {
	t.Helper()
	ents, err := os.ReadDir(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		a, _ := os.ReadFile(filepath.Join(want, e.Name()))
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s: pulled copy differs from the original (%v)", e.Name(), err)
		}
	}
	got, _ := filepath.Glob(filepath.Join(dir, "*"+PartialSuffix))
	if len(got) != 0 {
		t.Errorf("partial files left: %v", got)
	}
}

func requested(h *hubtest.Hub, sub string) bool {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	for _, r := range h.Requests {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

// TestPullResumesDroppedConnections pulls the tiny model through rate
// limits and connections dropped mid-file: every file arrives whole, the
// drops are resumed with Range requests, and the directory is complete.
func TestPullResumesDroppedConnections(t *testing.T) {
	h := fakeHub(t)
	h.DropAfter[shard], h.Drops[shard] = 1<<20, 2
	h.DropAfter["tokenizer.json"], h.Drops["tokenizer.json"] = 1000, 1
	h.RateLimit = 2
	dir := t.TempDir()
	ref, err := ParseRef("tiny/qwen3-moe")
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	c := client(h)
	c.Log = &log
	r, err := c.Pull(context.Background(), ref, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Commit != hubtest.Commit || len(r.Files) != 9 {
		t.Errorf("repo %+v", r)
	}
	sameFiles(t, dir, tinyDir)
	if !Complete(dir) {
		t.Error("the pulled directory is not marked complete")
	}
	if !requested(h, "/"+shard+" bytes=1048576-") || !requested(h, "/tokenizer.json bytes=1000-") {
		t.Errorf("no resumed Range requests in %v", h.Requests)
	}
	if !strings.Contains(log.String(), "pulled "+shard) {
		t.Errorf("log %q", log.String())
	}
	// A second pull finds everything whole and downloads nothing.
	h.Mu.Lock()
	h.Requests = nil
	h.Mu.Unlock()
	if _, err := c.Pull(context.Background(), ref, nil, dir); err != nil {
		t.Fatal(err)
	}
	if requested(h, "/resolve/") {
		t.Errorf("a second pull downloaded again: %v", h.Requests)
	}
}

// TestPullInclude selects files by glob.
func TestPullInclude(t *testing.T) {
	h := fakeHub(t)
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	if _, err := client(h).Pull(context.Background(), ref, []string{"config.json", "tokenizer*"}, dir); err != nil {
		t.Fatal(err)
	}
	var got []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if want := ".sluice-pull.json config.json tokenizer.json tokenizer_config.json"; strings.Join(got, " ") != want {
		t.Errorf("pulled %v, want %s", got, want)
	}
	if _, err := client(h).Pull(context.Background(), ref, []string{"*.gguf"}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "no file") {
		t.Errorf("a glob matching nothing: %v", err)
	}
}

// TestPullBadRepos checks the errors for a missing repository, a gated
// one without (and with) the token, and a missing revision.
func TestPullBadRepos(t *testing.T) {
	h := fakeHub(t)
	h.Token = "hf_secret"
	h.Repos["gated/model"] = &hubtest.Repo{Files: map[string][]byte{"config.json": []byte("{}")}, Gated: true}
	for _, tc := range []struct {
		ref, token, want string
	}{
		{"nobody/nothing", "", "repository nobody/nothing not found"},
		{"nobody/nothing", "hf_other", "repository nobody/nothing not found"},
		{"gated/model", "", "gated/model is gated"},
		{"gated/model", "hf_wrong", "HF_TOKEN is set but was not enough"},
		{"tiny/qwen3-moe@v9", "", `has no revision "v9"`},
	} {
		ref, err := ParseRef(tc.ref)
		if err != nil {
			t.Fatal(err)
		}
		c := client(h)
		c.Token = tc.token
		dir := t.TempDir()
		_, err = c.Pull(context.Background(), ref, nil, dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s (token %q): error %v; want %q", tc.ref, tc.token, err, tc.want)
		}
		if Complete(dir) {
			t.Errorf("%s: marked complete after an error", tc.ref)
		}
	}
	c := client(h)
	c.Token = "hf_secret"
	dir := t.TempDir()
	ref, _ := ParseRef("gated/model")
	if _, err := c.Pull(context.Background(), ref, nil, dir); err != nil || !Complete(dir) {
		t.Errorf("gated repository with its token: %v", err)
	}
	// Rate limits past the retries end in a clear error.
	h.RateLimit = 100
	c = client(h)
	c.Retries = 2
	ref, _ = ParseRef("tiny/qwen3-moe")
	if _, err := c.Pull(context.Background(), ref, nil, t.TempDir()); err == nil || !strings.Contains(err.Error(), "rate-limiting") {
		t.Errorf("rate limited: %v", err)
	}
}

// TestPullTruncatedAndCorrupt checks a file the hub serves short (an
// error naming it, the partial kept and resumed once the hub serves it
// whole) and one that arrives corrupted (discarded, never given its name).
func TestPullTruncatedAndCorrupt(t *testing.T) {
	h := fakeHub(t)
	h.Truncate[shard] = 1000
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	c := client(h)
	c.Retries = 1
	_, err := c.Pull(context.Background(), ref, nil, dir)
	if err == nil || !strings.Contains(err.Error(), "truncated") || !strings.Contains(err.Error(), shard) {
		t.Fatalf("truncated file: %v", err)
	}
	st, err := os.Stat(filepath.Join(dir, shard+PartialSuffix))
	orig, _ := os.Stat(filepath.Join(tinyDir, shard))
	if err != nil || st.Size() != orig.Size()-1000 {
		t.Fatalf("partial file after a truncated download: %v, %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(dir, shard)); err == nil || Complete(dir) {
		t.Fatal("a truncated file took its final name")
	}
	h.Mu.Lock()
	delete(h.Truncate, shard)
	h.Corrupt["tokenizer.json"] = true
	h.Requests = nil
	h.Mu.Unlock()
	os.Remove(filepath.Join(dir, "tokenizer.json")) // in case the first pull finished it
	_, err = c.Pull(context.Background(), ref, nil, dir)
	if err == nil || !strings.Contains(err.Error(), "does not match the hub's") || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("corrupt file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		t.Fatal("a corrupt file took its final name")
	}
	h.Mu.Lock()
	delete(h.Corrupt, "tokenizer.json")
	h.Mu.Unlock()
	if _, err := c.Pull(context.Background(), ref, nil, dir); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, dir, tinyDir)
	if want := "/" + shard + " bytes="; !requested(h, want) {
		t.Errorf("the truncated file was not resumed: %v", h.Requests)
	}
}

// failingFile fails with ENOSPC once it has taken room bytes.
type failingFile struct {
	f    *os.File
	room *int64
}

func (w failingFile) Write(b []byte) (int, error) {
	if int64(len(b)) > *w.room {
		n, _ := w.f.Write(b[:*w.room])
		*w.room = 0
		return n, &os.PathError{Op: "write", Path: w.f.Name(), Err: syscall.ENOSPC}
	}
	*w.room -= int64(len(b))
	return w.f.Write(b)
}

func (w failingFile) Close() error { return w.f.Close() }

// TestPullDiskFull fills the "disk" mid-download: a clear error, the
// partial file kept, and the next pull resumes it.
func TestPullDiskFull(t *testing.T) {
	h := fakeHub(t)
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	c := client(h)
	c.Parallel = 1
	room := int64(3 << 20)
	c.openPartial = func(name string) (writeCloser, error) {
		f, err := openAppend(name)
		if err != nil {
			return nil, err
		}
		return failingFile{f.(*os.File), &room}, nil
	}
	_, err := c.Pull(context.Background(), ref, nil, dir)
	if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "run the same command again to resume") {
		t.Fatalf("disk full: %v", err)
	}
	parts, _ := filepath.Glob(filepath.Join(dir, "*"+PartialSuffix))
	if len(parts) != 1 {
		t.Fatalf("partial files after a full disk: %v", parts)
	}
	if st, _ := os.Stat(parts[0]); st == nil || st.Size() != 3<<20 {
		t.Fatalf("partial file %s: %v", parts[0], st)
	}
	c.openPartial = nil
	if _, err := c.Pull(context.Background(), ref, nil, dir); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, dir, tinyDir)
	if !requested(h, " bytes=3145728-") {
		t.Errorf("no resume after the full disk: %v", h.Requests)
	}
}

// TestPullCancel cancels a pull midway (Ctrl-C): the error is the
// cancellation, partial files stay, and a later pull completes.
func TestPullCancel(t *testing.T) {
	h := fakeHub(t)
	h.Delay = 5 * time.Millisecond
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // Ctrl-C once some bytes have landed
		for ctx.Err() == nil {
			parts, _ := filepath.Glob(filepath.Join(dir, "*"+PartialSuffix))
			for _, p := range parts {
				if st, err := os.Stat(p); err == nil && st.Size() > 0 {
					cancel()
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	_, err := client(h).Pull(ctx, ref, nil, dir)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled pull: %v", err)
	}
	if Complete(dir) {
		t.Fatal("a cancelled pull is marked complete")
	}
	parts, _ := filepath.Glob(filepath.Join(dir, "*"+PartialSuffix))
	if len(parts) == 0 {
		ents, _ := os.ReadDir(dir)
		t.Fatalf("a cancelled pull kept no partial file: %v", ents)
	}
	h.Mu.Lock()
	h.Delay = 0
	h.Mu.Unlock()
	if _, err := client(h).Pull(context.Background(), ref, nil, dir); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, dir, tinyDir)
}

func TestParseRef(t *testing.T) {
	for in, want := range map[string]string{
		"Qwen/Qwen3-30B-A3B":        "Qwen/Qwen3-30B-A3B main",
		"a/b@v1.0":                  "a/b v1.0",
		"a/b@refs/pr/1":             "a/b refs/pr/1",
		"a":                         "error",
		"a/b/c":                     "error",
		"../b":                      "error",
		"a/b@":                      "error",
		"./models/x":                "error",
		"/abs/path":                 "error",
		"owner/name with space":     "error",
		"org.name/model_name-1.5.x": "org.name/model_name-1.5.x main",
	} {
		r, err := ParseRef(in)
		got := r.Repo + " " + r.Revision
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("ParseRef(%q) = %q (%v), want %q", in, got, err, want)
		}
	}
}

// TestProgressBar checks the bar's last drawing: all bytes, all files.
func TestProgressBar(t *testing.T) {
	h := fakeHub(t)
	var bar bytes.Buffer
	c := client(h)
	c.Progress = &bar
	ref, _ := ParseRef("tiny/qwen3-moe")
	if _, err := c.Pull(context.Background(), ref, nil, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var total int64
	ents, _ := os.ReadDir(tinyDir)
	for _, e := range ents {
		info, _ := e.Info()
		total += info.Size()
	}
	want := fmt.Sprintf("%.1f MB / %.1f MB", float64(total)/(1<<20), float64(total)/(1<<20))
	lines := strings.Split(strings.TrimSuffix(bar.String(), "\n"), "\r")
	last := lines[len(lines)-1]
	if !strings.Contains(last, "[==============================] 100%") || !strings.Contains(last, want) || !strings.Contains(last, fmt.Sprintf("%d/%d files", len(ents), len(ents))) {
		t.Errorf("last progress line %q", last)
	}
}

// TestRetriesCountOnlyFailuresWithoutProgress drops a file's connection
// more times than Retries, each time after some bytes: the pull still
// completes, since a retry that moved forward does not count; a hub that
// keeps failing without progress does exhaust the retries.
func TestRetriesCountOnlyFailuresWithoutProgress(t *testing.T) {
	h := fakeHub(t)
	h.DropAfter[shard], h.Drops[shard] = 2<<20, 5
	c := client(h)
	c.Retries = 2
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	if _, err := c.Pull(context.Background(), ref, nil, dir); err != nil {
		t.Fatalf("a flaky but progressing download: %v", err)
	}
	sameFiles(t, dir, tinyDir)
	h.Mu.Lock()
	h.DropAfter["config.json"], h.Drops["config.json"] = 0, 10
	h.Mu.Unlock()
	os.Remove(filepath.Join(dir, "config.json"))
	if _, err := c.Pull(context.Background(), ref, nil, dir); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Fatalf("a download that never progresses: %v", err)
	}
}

// TestPullStalledConnection holds a connection open and silent mid-file:
// the download gives up on it after the stall timeout and resumes.
func TestPullStalledConnection(t *testing.T) {
	h := fakeHub(t)
	h.StallAfter[shard], h.Stalls[shard] = 1<<20, 1
	c := client(h)
	c.Stall = time.Second
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	if _, err := c.Pull(context.Background(), ref, nil, dir); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, dir, tinyDir)
	if !requested(h, "/"+shard+" bytes=1048576-") {
		t.Errorf("the stalled download was not resumed: %v", h.Requests)
	}
}

// TestPullRefusesWhatCannotFit checks the free-space check before a
// download: too little room is a clear error and nothing is fetched.
func TestPullRefusesWhatCannotFit(t *testing.T) {
	h := fakeHub(t)
	c := client(h)
	c.freeBytes = func(string) int64 { return 10 << 20 }
	dir := t.TempDir()
	ref, _ := ParseRef("tiny/qwen3-moe")
	_, err := c.Pull(context.Background(), ref, nil, dir)
	if err == nil || !strings.Contains(err.Error(), "only 10.0 MB is free there") {
		t.Fatalf("too little space: %v", err)
	}
	if requested(h, "/resolve/") {
		t.Errorf("files were downloaded anyway: %v", h.Requests)
	}
	if free := platform.FreeBytes(dir); free == 0 {
		t.Errorf("platform.FreeBytes(%s) = 0", dir)
	}
}
