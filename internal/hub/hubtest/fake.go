// Package hubtest is a fake Hugging Face hub for tests: an httptest server
// that serves directories as repositories with the hub's response shapes
// (model info with blobs, resolve with Range support, X-Error-Code
// headers), and misbehaves on request: dropped connections, truncated
// files, rate limits and gated repositories.
package hubtest

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Repo is one fake repository.
type Repo struct {
	Files map[string][]byte // path → content
	// LFS holds the paths stored with LFS (sha256 in the model info);
	// nil = every .safetensors file.
	LFS map[string]bool
	// Gated requires the hub's token for everything.
	Gated bool
}

// Hub is the fake hub. Its fields may be changed between requests under
// Mu.
type Hub struct {
	*httptest.Server
	Token string // the token that opens gated repositories

	Mu    sync.Mutex
	Repos map[string]*Repo
	// DropAfter, per file path, cuts the connection after this many bytes
	// of the next N responses (N = Drops[path]).
	DropAfter map[string]int64
	Drops     map[string]int
	// Truncate, per file path, serves this many bytes fewer than the file
	// holds, with a matching Content-Length (a short file, cleanly).
	Truncate map[string]int64
	// StallAfter, per file path, goes silent (the connection open, nothing
	// sent) after this many bytes of the next N responses (N =
	// Stalls[path]), until the client hangs up.
	StallAfter map[string]int64
	Stalls     map[string]int
	// Corrupt, per file path, flips a byte of what is served.
	Corrupt map[string]bool
	// RateLimit answers 429 to the next N requests of any kind.
	RateLimit int
	// Delay sleeps before each chunk of 64 KiB of file content.
	Delay time.Duration
	// Requests logs "METHOD PATH RANGE" of each request.
	Requests []string
}

// New serves the fake hub until the test's cleanup closes it.
func New() *Hub {
	h := &Hub{Repos: map[string]*Repo{}, DropAfter: map[string]int64{}, Drops: map[string]int{}, Truncate: map[string]int64{}, Corrupt: map[string]bool{},
		StallAfter: map[string]int64{}, Stalls: map[string]int{}}
	h.Server = httptest.NewServer(h)
	return h
}

// AddDir adds a repository holding the regular files of dir.
func (h *Hub) AddDir(repo, dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	r := &Repo{Files: map[string][]byte{}}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		r.Files[e.Name()] = b
	}
	h.Mu.Lock()
	h.Repos[repo] = r
	h.Mu.Unlock()
	return nil
}

// Commit is the fake commit every revision resolves to.
const Commit = "0123456789abcdef0123456789abcdef01234567"

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// ServeHTTP answers /api/models/{owner}/{name}/revision/{rev} and
// /{owner}/{name}/resolve/{rev}/{path}.
func (h *Hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.Mu.Lock()
	h.Requests = append(h.Requests, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+r.Header.Get("Range")))
	if h.RateLimit > 0 {
		h.RateLimit--
		h.Mu.Unlock()
		w.Header().Set("Retry-After", "0")
		hubError(w, http.StatusTooManyRequests, "", "rate limit reached")
		return
	}
	h.Mu.Unlock()
	p := r.URL.EscapedPath()
	if rest, ok := strings.CutPrefix(p, "/api/models/"); ok {
		parts := strings.SplitN(rest, "/", 4)
		if len(parts) != 4 || parts[2] != "revision" {
			hubError(w, http.StatusNotFound, "", "not found")
			return
		}
		repo := h.open(w, r, parts[0]+"/"+parts[1], parts[3])
		if repo == nil {
			return
		}
		h.info(w, r, parts[0]+"/"+parts[1], repo)
		return
	}
	parts := strings.SplitN(strings.TrimPrefix(p, "/"), "/", 5)
	if len(parts) != 5 || parts[2] != "resolve" {
		hubError(w, http.StatusNotFound, "", "not found")
		return
	}
	repo := h.open(w, r, parts[0]+"/"+parts[1], parts[3])
	if repo == nil {
		return
	}
	h.serveFile(w, r, repo, parts[4])
}

// open finds a repository and checks access the way the hub does: an
// unknown repository is 401 RepoNotFound without a token (the hub does not
// tell private from missing) and 404 with one.
func (h *Hub) open(w http.ResponseWriter, r *http.Request, name, rev string) *Repo {
	h.Mu.Lock()
	repo := h.Repos[name]
	h.Mu.Unlock()
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case repo == nil && tok == "":
		hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository Not Found for url: "+r.URL.Path+".")
		return nil
	case repo == nil:
		hubError(w, http.StatusNotFound, "RepoNotFound", "Repository Not Found for url: "+r.URL.Path+".")
		return nil
	case repo.Gated && tok != h.Token:
		hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+name+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
		return nil
	case rev != "main" && rev != Commit:
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return nil
	}
	return repo
}

func (h *Hub) isLFS(repo *Repo, p string) bool {
	if repo.LFS != nil {
		return repo.LFS[p]
	}
	return strings.HasSuffix(p, ".safetensors")
}

// info writes the model info with blobs, as the hub's
// /api/models/{repo}/revision/{rev}?blobs=true does.
func (h *Hub) info(w http.ResponseWriter, r *http.Request, name string, repo *Repo) {
	type lfs struct {
		SHA256      string `json:"sha256"`
		Size        int64  `json:"size"`
		PointerSize int    `json:"pointerSize"`
	}
	type sibling struct {
		RFilename string `json:"rfilename"`
		BlobID    string `json:"blobId,omitempty"`
		Size      *int64 `json:"size,omitempty"`
		LFS       *lfs   `json:"lfs,omitempty"`
	}
	var names []string
	for p := range repo.Files {
		names = append(names, p)
	}
	sort.Strings(names)
	blobs := r.URL.Query().Get("blobs") == "true"
	var sibs []sibling
	for _, p := range names {
		b := repo.Files[p]
		s := sibling{RFilename: p}
		if blobs {
			n := int64(len(b))
			s.Size = &n
			if h.isLFS(repo, p) {
				sum := sha256.Sum256(b)
				s.BlobID = fmt.Sprintf("%x", sha1.Sum([]byte(p))) // the pointer's blob id; not the content's
				s.LFS = &lfs{SHA256: hex.EncodeToString(sum[:]), Size: n, PointerSize: 134}
			} else {
				g := sha1.New()
				fmt.Fprintf(g, "blob %d\x00", len(b))
				g.Write(b)
				s.BlobID = hex.EncodeToString(g.Sum(nil))
			}
		}
		sibs = append(sibs, s)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"_id": "fake", "id": name, "modelId": name, "sha": Commit,
		"private": false, "gated": map[bool]any{true: "manual", false: false}[repo.Gated], "siblings": sibs})
}

// serveFile serves a file with Range support, dropping or truncating it
// when asked.
func (h *Hub) serveFile(w http.ResponseWriter, r *http.Request, repo *Repo, escaped string) {
	p := strings.ReplaceAll(escaped, "%2F", "/")
	b, ok := repo.Files[p]
	if !ok {
		hubError(w, http.StatusNotFound, "EntryNotFound", p+" does not exist on \"main\"")
		return
	}
	h.Mu.Lock()
	drop := int64(-1)
	if h.Drops[p] > 0 {
		h.Drops[p]--
		drop = h.DropAfter[p]
	}
	if cut := h.Truncate[p]; cut > 0 && cut <= int64(len(b)) {
		b = b[:int64(len(b))-cut]
	}
	if h.Corrupt[p] && len(b) > 0 {
		b = append([]byte(nil), b...)
		b[len(b)/2] ^= 0xff
	}
	stall := int64(-1)
	if h.Stalls[p] > 0 {
		h.Stalls[p]--
		stall = h.StallAfter[p]
	}
	delay := h.Delay
	h.Mu.Unlock()
	w.Header().Set("ETag", fmt.Sprintf("%q", fmt.Sprintf("%x", sha256.Sum256(b))))
	var out http.ResponseWriter = w
	if drop >= 0 || delay > 0 || stall >= 0 {
		out = &misbehave{ResponseWriter: w, left: drop, delay: delay, stallLeft: stall, done: r.Context().Done()}
	}
	http.ServeContent(out, r, p, time.Time{}, bytes.NewReader(b))
}

// misbehave aborts the connection after left bytes (when left >= 0),
// goes silent after stallLeft bytes (when >= 0) until the client hangs
// up, and sleeps before each write.
type misbehave struct {
	http.ResponseWriter
	left      int64
	delay     time.Duration
	stallLeft int64
	done      <-chan struct{}
}

func (m *misbehave) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), 64<<10)
		if m.left >= 0 && int64(k) > m.left {
			k = int(m.left)
		}
		if m.stallLeft >= 0 && int64(k) > m.stallLeft {
			k = int(m.stallLeft)
		}
		if m.delay > 0 {
			time.Sleep(m.delay)
		}
		if k > 0 {
			w, err := m.ResponseWriter.Write(b[:k])
			n += w
			m.left -= int64(w)
			m.stallLeft -= int64(w)
			if err != nil {
				return n, err
			}
			b = b[k:]
		}
		if m.stallLeft == 0 {
			if f, ok := m.ResponseWriter.(http.Flusher); ok {
				f.Flush()
			}
			<-m.done // silent until the client gives up
			panic(http.ErrAbortHandler)
		}
		if m.left == 0 {
			if f, ok := m.ResponseWriter.(http.Flusher); ok {
				f.Flush()
			}
			panic(http.ErrAbortHandler) // the connection drops mid-file
		}
	}
	return n, nil
}
