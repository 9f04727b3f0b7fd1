// Package hub downloads model repositories from the Hugging Face hub over
// its public HTTP API: the model-info endpoint for the file list (sizes,
// LFS sha256, git blob ids) and the resolve endpoint for the content.
// Downloads run in parallel, resume from ".partial" files with Range
// requests after a dropped connection, a rate limit or an interrupted run,
// and are checked against the hub's sizes and hashes before they take
// their final names, so that a file under its final name is always whole.
package hub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicelm/sluice/internal/platform"
)

// DefaultEndpoint is the hub's address unless HF_ENDPOINT says otherwise.
const DefaultEndpoint = "https://huggingface.co"

// PartialSuffix ends the name of a file still downloading.
const PartialSuffix = ".partial"

// Ref names a repository at a revision.
type Ref struct {
	Repo     string // "owner/name"
	Revision string // branch, tag or commit; "" = main
}

// String is "owner/name" or "owner/name@revision".
func (r Ref) String() string {
	if r.Revision == "" || r.Revision == "main" {
		return r.Repo
	}
	return r.Repo + "@" + r.Revision
}

var repoPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$`)

// ParseRef parses "owner/name[@revision]".
func ParseRef(s string) (Ref, error) {
	repo, rev, _ := strings.Cut(s, "@")
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || !repoPart.MatchString(owner) || !repoPart.MatchString(name) || strings.Contains(repo, "..") {
		return Ref{}, fmt.Errorf("%q is not a hub repository: want OWNER/NAME[@REVISION], e.g. Qwen/Qwen3-30B-A3B", s)
	}
	if strings.Contains(s, "@") && (rev == "" || strings.ContainsAny(rev, " \t\n")) {
		return Ref{}, fmt.Errorf("%q: the revision after @ is empty or has spaces", s)
	}
	if rev == "" {
		rev = "main"
	}
	return Ref{Repo: repo, Revision: rev}, nil
}

// LooksLikeRef reports whether s has the shape of "owner/name[@revision]".
// A caller that also accepts directories checks those first.
func LooksLikeRef(s string) bool {
	_, err := ParseRef(s)
	return err == nil
}

// File is one file of a repository as the hub describes it.
type File struct {
	Path   string // the repository path, "/"-separated
	Size   int64
	SHA256 string // of the content, for LFS files; "" otherwise
	BlobID string // the git blob id (sha1 of "blob SIZE\0" + content); checked when SHA256 is absent
}

// Repo is a repository's file list at a resolved commit.
type Repo struct {
	Ref
	Commit string // the commit the revision resolved to
	Files  []File
}

// Error is an answer of the hub that is not a success, with what it
// means for the user.
type Error struct {
	Status  int
	Code    string // the hub's X-Error-Code: RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound
	Message string
}

func (e *Error) Error() string { return e.Message }

// Client talks to one hub endpoint.
type Client struct {
	Endpoint string        // "" = $HF_ENDPOINT, else DefaultEndpoint
	Token    string        // sent as a bearer token when set ($HF_TOKEN)
	HTTP     *http.Client  // nil = a client without an overall timeout (files are large)
	Parallel int           // files downloading at once; 0 = 4
	Retries  int           // retries in a row without progress before a file fails; 0 = 8
	Stall    time.Duration // a download that receives nothing this long is retried; 0 = 1 minute
	// Progress, when set, gets a progress bar redrawn in place (a terminal);
	// Log, when set and Progress is not, gets one line per finished file.
	Progress io.Writer
	Log      io.Writer

	// openPartial opens a partial file for writing at its end; tests
	// replace it to simulate a full disk.
	openPartial func(name string) (writeCloser, error)
	// backoff is the wait before retry attempt n (from 1); tests shorten it.
	backoff func(n int) time.Duration
	// freeBytes replaces the file system's free space in tests.
	freeBytes func(dir string) int64
}

type writeCloser interface {
	io.Writer
	Close() error
}

// NewClient is a client configured from HF_ENDPOINT and HF_TOKEN.
func NewClient() *Client {
	return &Client{Endpoint: os.Getenv("HF_ENDPOINT"), Token: os.Getenv("HF_TOKEN")}
}

func (c *Client) endpoint() string {
	ep := c.Endpoint
	if ep == "" {
		ep = os.Getenv("HF_ENDPOINT")
	}
	if ep == "" {
		ep = DefaultEndpoint
	}
	return strings.TrimRight(ep, "/")
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) request(ctx context.Context, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "sluice")
	if c.Token != "" {
		// Go's client drops this header on a redirect to another host (the
		// hub redirects LFS content to its CDN), as it should.
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return req, nil
}

// modelInfo is the part of GET /api/models/{repo}/revision/{rev}?blobs=true
// that a download needs.
type modelInfo struct {
	ID       string `json:"id"`
	SHA      string `json:"sha"`
	Siblings []struct {
		RFilename string `json:"rfilename"`
		Size      *int64 `json:"size"`
		BlobID    string `json:"blobId"`
		LFS       *struct {
			SHA256 string `json:"sha256"`
			Size   int64  `json:"size"`
		} `json:"lfs"`
	} `json:"siblings"`
}

// Info fetches the file list of ref, retrying rate limits and server
// errors.
func (c *Client) Info(ctx context.Context, ref Ref) (*Repo, error) {
	rev := ref.Revision
	if rev == "" {
		rev = "main"
	}
	u := fmt.Sprintf("%s/api/models/%s/revision/%s?blobs=true", c.endpoint(), ref.Repo, url.PathEscape(rev))
	var body []byte
	err := c.retry(ctx, func() (bool, bool, error) {
		again, err := c.info(ctx, u, ref, &body)
		return again, false, err
	})
	if err != nil {
		return nil, err
	}
	return c.parseInfo(ref, rev, body)
}

// info makes one model-info request; on failure it says whether a retry
// may help.
func (c *Client) info(ctx context.Context, u string, ref Ref, body *[]byte) (bool, error) {
	req, err := c.request(ctx, u)
	if err != nil {
		return false, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		// A hub that cannot be reached at all (offline, a wrong
		// HF_ENDPOINT) is said at once; anything else may pass.
		var op *net.OpError
		dial := errors.As(err, &op) && op.Op == "dial"
		return !dial, fmt.Errorf("cannot reach the hub at %s for %s: %w", c.endpoint(), ref, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c.statusError(resp, ref, "")
	}
	*body, err = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return true, fmt.Errorf("reading %s's file list: %w", ref, err)
	}
	return false, nil
}

// parseInfo reads the model info of ref at rev.
func (c *Client) parseInfo(ref Ref, rev string, body []byte) (*Repo, error) {
	var mi modelInfo
	if err := json.Unmarshal(body, &mi); err != nil {
		return nil, fmt.Errorf("the hub's answer about %s is not model info JSON: %v", ref, err)
	}
	r := &Repo{Ref: Ref{Repo: ref.Repo, Revision: rev}, Commit: mi.SHA}
	for _, s := range mi.Siblings {
		f := File{Path: s.RFilename, BlobID: s.BlobID, Size: -1}
		if s.Size != nil {
			f.Size = *s.Size
		}
		if s.LFS != nil {
			f.SHA256, f.Size = strings.ToLower(s.LFS.SHA256), s.LFS.Size
		}
		if f.Size < 0 {
			return nil, fmt.Errorf("the hub gave no size for %s in %s (the file list was asked with blobs=true)", f.Path, ref)
		}
		if err := checkPath(f.Path); err != nil {
			return nil, fmt.Errorf("%s: %v", ref, err)
		}
		r.Files = append(r.Files, f)
	}
	return r, nil
}

// checkPath refuses repository paths that would leave the target
// directory.
func checkPath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("refusing the file name %q", p)
	}
	return nil
}

// Select returns the files matching any of the globs (path.Match against
// the repository path: "*" does not cross "/").
func (r *Repo) Select(globs []string) ([]File, error) {
	var out []File
	for _, f := range r.Files {
		for _, g := range globs {
			ok, err := path.Match(g, f.Path)
			if err != nil {
				return nil, fmt.Errorf("--include %q: %v", g, err)
			}
			if ok {
				out = append(out, f)
				break
			}
		}
	}
	return out, nil
}

// statusError turns a failed answer into an Error and says whether a
// retry may help (rate limits and server errors).
func (c *Client) statusError(resp *http.Response, ref Ref, file string) (bool, error) {
	code := resp.Header.Get("X-Error-Code")
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" {
		var b struct {
			Error string `json:"error"`
		}
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if json.Unmarshal(raw, &b) == nil {
			msg = b.Error
		}
	}
	e := &Error{Status: resp.StatusCode, Code: code}
	what := ref.String()
	if file != "" {
		what = file + " of " + what
	}
	tokenHint := "set HF_TOKEN to a token that can read it"
	if c.Token != "" {
		tokenHint = "HF_TOKEN is set but was not enough"
	}
	switch {
	case code == "GatedRepo":
		e.Message = fmt.Sprintf("%s is gated: accept its conditions on %s/%s, then %s", ref.Repo, c.endpoint(), ref.Repo, tokenHint)
	case code == "RevisionNotFound":
		e.Message = fmt.Sprintf("%s has no revision %q", ref.Repo, ref.Revision)
	case code == "EntryNotFound":
		e.Message = fmt.Sprintf("%s is not in %s", file, ref)
	case code == "RepoNotFound" || resp.StatusCode == http.StatusNotFound:
		e.Message = fmt.Sprintf("repository %s not found on %s (if it is private, %s)", ref.Repo, c.endpoint(), tokenHint)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		e.Message = fmt.Sprintf("the hub refused access to %s (%s): %s", what, resp.Status, tokenHint)
	case resp.StatusCode == http.StatusTooManyRequests:
		e.Message = fmt.Sprintf("the hub is rate-limiting requests for %s (429); try again later", what)
		return true, &retryAfter{e, parseRetryAfter(resp.Header.Get("Retry-After"))}
	case resp.StatusCode >= 500:
		e.Message = fmt.Sprintf("the hub failed on %s (%s)", what, resp.Status)
		return true, &retryAfter{e, parseRetryAfter(resp.Header.Get("Retry-After"))}
	default:
		e.Message = fmt.Sprintf("the hub answered %s for %s", resp.Status, what)
	}
	if msg != "" {
		e.Message += " (hub: " + msg + ")"
	}
	return false, e
}

// retryAfter is a retryable error with the wait the server asked for.
type retryAfter struct {
	err  error
	wait time.Duration
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

func parseRetryAfter(v string) time.Duration {
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, time.Minute)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), time.Minute)
	}
	return -1
}

// retry runs f until it succeeds, fails for good, or has failed
// retryably more than Retries times in a row without progress: an attempt
// that moved a download forward (a flaky connection, not a dead one)
// starts the count again.
func (c *Client) retry(ctx context.Context, f func() (retryable, progressed bool, err error)) error {
	tries := c.Retries
	if tries <= 0 {
		tries = 8
	}
	for n := 1; ; n++ {
		again, progressed, err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if progressed {
			n = 1
		}
		if !again || n > tries {
			return err
		}
		wait := c.wait(n)
		var ra *retryAfter
		if errors.As(err, &ra) && ra.wait >= 0 {
			wait = ra.wait
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *Client) wait(n int) time.Duration {
	if c.backoff != nil {
		return c.backoff(n)
	}
	return min(250*time.Millisecond<<min(n, 6), 10*time.Second)
}

// Download fetches files of r into dir, in parallel, resuming partial
// files. On failure or cancellation the partial files stay for the next
// run; only whole, verified files take their final names.
func (c *Client) Download(ctx context.Context, r *Repo, files []File, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files = append([]File(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Size > files[j].Size })
	// Refuse at once what cannot fit, rather than after hours of download.
	var need int64
	for _, f := range files {
		have := int64(0)
		final := filepath.Join(dir, filepath.FromSlash(f.Path))
		if st, err := os.Stat(final); err == nil && st.Size() == f.Size {
			have = f.Size
		} else if st, err := os.Stat(final + PartialSuffix); err == nil && st.Size() <= f.Size {
			have = st.Size()
		}
		need += f.Size - have
	}
	free := platform.FreeBytes
	if c.freeBytes != nil {
		free = c.freeBytes
	}
	if avail := free(dir); avail >= 0 && need > avail {
		return fmt.Errorf("%s needs %s more in %s, and only %s is free there; free some space (or pick another --dir) and run again", r.Ref, mb(need), dir, mb(avail))
	}
	p := &progress{start: time.Now(), files: len(files)}
	for _, f := range files {
		p.total += f.Size
	}
	stop := p.run(c.Progress)
	defer stop()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	par := c.Parallel
	if par <= 0 {
		par = 4
	}
	work := make(chan File)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for range min(par, max(len(files), 1)) {
		wg.Go(func() {
			for f := range work {
				if err := c.file(ctx, r, f, dir, p); err != nil {
					mu.Lock()
					if first == nil {
						first = err
						cancel() // one failure stops the rest; their partial files stay
					}
					mu.Unlock()
					continue
				}
				if c.Progress == nil && c.Log != nil {
					mu.Lock() // one line at a time
					fmt.Fprintf(c.Log, "pulled %s (%s)\n", f.Path, mb(f.Size))
					mu.Unlock()
				}
			}
		})
	}
feed:
	for _, f := range files {
		select {
		case work <- f:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	stop()
	if first != nil {
		if errors.Is(first, context.Canceled) && ctx.Err() != nil {
			return context.Canceled
		}
		return first
	}
	return ctx.Err()
}

// file downloads one file with retries.
func (c *Client) file(ctx context.Context, r *Repo, f File, dir string, p *progress) error {
	final := filepath.Join(dir, filepath.FromSlash(f.Path))
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	partial := final + PartialSuffix
	if st, err := os.Stat(final); err == nil {
		if st.Size() == f.Size {
			p.skip(f.Size) // verified when it took this name
			p.fileDone()
			return nil
		}
		// A final file of the wrong size (truncated, or from another
		// revision) is resumed from as a partial one; the hash check
		// catches a wrong prefix.
		if err := os.Rename(final, partial); err != nil {
			return err
		}
	}
	var counted int64 // bytes of this file added to the progress so far
	err := c.retry(ctx, func() (bool, bool, error) {
		before := counted
		again, err := c.attempt(ctx, r, f, partial, p, &counted)
		if err == nil {
			return false, false, os.Rename(partial, final)
		}
		return again, counted > before, err
	})
	if err == nil {
		p.fileDone()
	}
	return err
}

// attempt makes one request for the rest of partial and checks the file
// once whole; on failure it says whether a retry may help.
func (c *Client) attempt(ctx context.Context, r *Repo, f File, partial string, p *progress, counted *int64) (bool, error) {
	h, err := newHasher(f)
	if err != nil {
		return false, err
	}
	// Hash what an earlier attempt or run left.
	have := int64(0)
	if pf, err := os.Open(partial); err == nil {
		have, err = io.Copy(h, pf)
		pf.Close()
		if err != nil {
			return false, fmt.Errorf("reading %s: %v", partial, err)
		}
	}
	if have > f.Size {
		if err := os.Remove(partial); err != nil {
			return false, err
		}
		h.Reset()
		have = 0
	}
	p.set(counted, have)
	if have < f.Size {
		u := fmt.Sprintf("%s/%s/resolve/%s/%s", c.endpoint(), r.Repo, url.PathEscape(r.revisionForFiles()), escapePath(f.Path))
		// A connection that stays open but sends nothing is given up
		// after the stall timeout and retried from where it stopped.
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		stall := c.Stall
		if stall <= 0 {
			stall = time.Minute
		}
		var stalled atomic.Bool
		watchdog := time.AfterFunc(stall, func() { stalled.Store(true); cancel() })
		defer watchdog.Stop()
		req, err := c.request(actx, u)
		if err != nil {
			return false, err
		}
		if have > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
		}
		resp, err := c.http().Do(req)
		if err != nil {
			if stalled.Load() {
				return true, fmt.Errorf("downloading %s: no answer for %s", f.Path, stall)
			}
			return true, fmt.Errorf("downloading %s: %w", f.Path, err)
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusPartialContent && have > 0:
			if start := contentRangeStart(resp.Header.Get("Content-Range")); start != have {
				return true, fmt.Errorf("downloading %s: asked for bytes from %d, got a range from %d", f.Path, have, start)
			}
		case resp.StatusCode == http.StatusOK:
			if have > 0 { // the server ignored the range: start over
				if err := os.Truncate(partial, 0); err != nil {
					return false, err
				}
				h.Reset()
				have = 0
				p.set(counted, 0)
			}
		case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
			// The hub holds fewer bytes than its file list says.
			return true, fmt.Errorf("downloading %s: truncated: the hub serves nothing past byte %d of the %d its file list gives (kept in %s for a resume)", f.Path, have, f.Size, partial)
		default:
			return c.statusError(resp, r.Ref, f.Path)
		}
		open := c.openPartial
		if open == nil {
			open = openAppend
		}
		w, err := open(partial)
		if err != nil {
			return false, fmt.Errorf("writing %s: %v", partial, err)
		}
		n, rerr, werr := copyBody(io.MultiWriter(w, h), resp.Body, f.Size-have, func(k int64) {
			p.add(counted, k)
			watchdog.Reset(stall)
		})
		cerr := w.Close()
		have += n
		if werr == nil {
			werr = cerr
		}
		if werr != nil {
			hint := ""
			if errors.Is(werr, syscall.ENOSPC) {
				hint = "; free some space and run the same command again to resume"
			}
			return false, fmt.Errorf("writing %s: %w (the %s downloaded so far stay in %s%s)", f.Path, werr, mb(have), partial, hint)
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if stalled.Load() {
				rerr = fmt.Errorf("no data for %s", stall)
			}
			return true, fmt.Errorf("downloading %s: the connection broke after %s of %s: %v", f.Path, mb(have), mb(f.Size), rerr)
		}
	}
	if have < f.Size {
		return true, fmt.Errorf("downloading %s: truncated: got %d of %d bytes (kept in %s for a resume)", f.Path, have, f.Size, partial)
	}
	if got, want := hex.EncodeToString(h.Sum(nil)), h.want; got != want {
		os.Remove(partial)
		p.set(counted, 0)
		return true, fmt.Errorf("%s: %s %s does not match the hub's %s; the download was discarded", f.Path, h.kind, got, want)
	}
	return false, nil
}

// revisionForFiles pins file downloads to the commit the file list came
// from, so that a branch moving during a pull cannot mix revisions.
func (r *Repo) revisionForFiles() string {
	if len(r.Commit) == 40 {
		return r.Commit
	}
	return r.Revision
}

func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

func contentRangeStart(v string) int64 {
	// "bytes START-END/TOTAL"
	v, ok := strings.CutPrefix(strings.TrimSpace(v), "bytes ")
	if !ok {
		return -1
	}
	s, _, _ := strings.Cut(v, "-")
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func openAppend(name string) (writeCloser, error) {
	return os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
}

// copyBody copies at most limit bytes, reporting progress, and tells read
// errors from write errors.
func copyBody(w io.Writer, r io.Reader, limit int64, report func(int64)) (n int64, rerr, werr error) {
	buf := make([]byte, 256<<10)
	r = io.LimitReader(r, limit)
	for {
		k, err := r.Read(buf)
		if k > 0 {
			m, e := w.Write(buf[:k])
			n += int64(m)
			report(int64(m))
			if e != nil {
				return n, nil, e
			}
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// hasher checks a file against the hub's sha256 (LFS files) or git blob
// id (others).
type hasher struct {
	hash.Hash
	want, kind string
	size       int64
}

func newHasher(f File) (*hasher, error) {
	switch {
	case f.SHA256 != "":
		return &hasher{Hash: sha256.New(), want: f.SHA256, kind: "sha256"}, nil
	case len(f.BlobID) == 40:
		h := &hasher{Hash: sha1.New(), want: strings.ToLower(f.BlobID), kind: "git blob id", size: f.Size}
		h.Reset()
		return h, nil
	}
	return nil, fmt.Errorf("the hub gave neither a sha256 nor a blob id for %s; refusing an unchecked download", f.Path)
}

// Reset restarts the hash; a git blob id hashes a header first.
func (h *hasher) Reset() {
	h.Hash.Reset()
	if h.kind == "git blob id" {
		fmt.Fprintf(h.Hash, "blob %d\x00", h.size)
	}
}

// progress counts bytes for the progress bar.
type progress struct {
	start        time.Time
	total        int64
	done         atomic.Int64 // bytes on disk of the selected files
	fetched      atomic.Int64 // bytes received this run
	files        int
	filesDone    atomic.Int64
	mu           sync.Mutex
	stopped      bool
	stopDrawing  chan struct{}
	drawingEnded chan struct{}
}

func (p *progress) skip(n int64) { p.done.Add(n) }
func (p *progress) fileDone()    { p.filesDone.Add(1) }

// set makes this file's counted bytes equal n (after hashing a partial file
// or starting over).
func (p *progress) set(counted *int64, n int64) {
	p.done.Add(n - *counted)
	*counted = n
}

func (p *progress) add(counted *int64, n int64) {
	*counted += n
	p.done.Add(n)
	p.fetched.Add(n)
}

// run draws the bar on w every 200 ms until the returned func is called
// (idempotent); nil w draws nothing.
func (p *progress) run(w io.Writer) func() {
	if w == nil {
		return func() {}
	}
	p.stopDrawing, p.drawingEnded = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.drawingEnded)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw(w, false)
			case <-p.stopDrawing:
				p.draw(w, true)
				return
			}
		}
	}()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.stopped {
			p.stopped = true
			close(p.stopDrawing)
			<-p.drawingEnded
		}
	}
}

func (p *progress) draw(w io.Writer, last bool) {
	done, total := p.done.Load(), max(p.total, 1)
	const width = 30
	k := int(int64(width) * min(done, total) / total)
	bar := strings.Repeat("=", k) + strings.Repeat(" ", width-k)
	if k < width && k > 0 {
		bar = bar[:k-1] + ">" + bar[k:]
	}
	rate := float64(p.fetched.Load()) / max(time.Since(p.start).Seconds(), 1e-3)
	end := ""
	if last {
		end = "\n"
	}
	fmt.Fprintf(w, "\r[%s] %3d%% %s / %s  %s/s  %d/%d files\x1b[K%s", bar, 100*done/total, mb(done), mb(p.total), mb(int64(rate)), p.filesDone.Load(), p.files, end)
}

// mb formats a byte count.
func mb(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f kB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
