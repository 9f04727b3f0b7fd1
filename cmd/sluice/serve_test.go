package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// served is a `sluice serve` process on a free loopback port.
type served struct {
	cmd    *exec.Cmd
	url    string
	mu     sync.Mutex
	stderr strings.Builder
	exited chan error
}

func (s *served) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// serve starts the binary with args and waits until it listens.
func serve(t *testing.T, args ...string) *served {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--threads", "1"}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_CACHE="+cache)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &served{cmd: cmd, exited: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			s.stderr.WriteString(line + "\n")
			s.mu.Unlock()
			if _, rest, ok := strings.Cut(line, " on http://"); ok {
				a, _, _ := strings.Cut(rest, ": ") // "HOST:PORT: N slots ..."
				select {
				case addr <- a:
				default:
				}
			}
		}
		s.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	select {
	case a := <-addr:
		s.url = "http://" + a
	case err := <-s.exited:
		t.Fatalf("serve exited before listening: %v\n%s", err, s.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not start listening\n%s", s.log())
	}
	return s
}

// wait waits for the process to exit and returns its exit code.
func (s *served) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-s.exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not exit\n%s", s.log())
		return -1
	}
}

func postJSON(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestServeMatchesRunAndDrainsOnSIGTERM checks that the server's greedy
// completion equals `sluice run --temp 0` for the same prompt, and that on
// SIGTERM a request in flight still finishes, then the process exits 0.
func TestServeMatchesRunAndDrainsOnSIGTERM(t *testing.T) {
	const prompt = "def fibonacci(n):"
	out, _ := ok(t, "run", "-p", prompt, "-n", "24", "--temp", "0", "--json", "--threads", "1")
	var run struct {
		Text string `json:"text"`
	}
	decode(t, out, &run)

	s := serve(t)
	resp := postJSON(t, s.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 24, "temperature": 0})
	var got struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || len(got.Choices) != 1 {
		t.Fatalf("completion: %v %+v", err, got)
	}
	resp.Body.Close()
	if got.Choices[0].Text != run.Text {
		t.Fatalf("serve %q, run %q", got.Choices[0].Text, run.Text)
	}

	resp = postJSON(t, s.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first stream line %q: %v", line, err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream after SIGTERM: %v", err)
	}
	if !strings.Contains(string(rest), `"finish_reason":"length"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the request in flight did not finish:\n%s", rest)
	}
	if code := s.wait(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM\n%s", code, s.log())
	}
	if _, err := http.Get(s.url + "/health"); err == nil {
		t.Fatal("still accepting after exit")
	}
}

// TestServeGraceCancels checks that requests still running when the grace
// period ends are cancelled with an error event, and the exit is still 0.
func TestServeGraceCancels(t *testing.T) {
	s := serve(t, "--grace", "300ms")
	resp := postJSON(t, s.url+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}},
		"max_tokens": 4000, "temperature": 0, "ignore_eos": true, "stream": true})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	s.cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), `"error"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Errorf("want an error event and [DONE] at the end:\n%.2000s", rest)
	}
	if code := s.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.log())
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("took %v to stop with a 300ms grace", d)
	}
	if !strings.Contains(s.log(), "cancelling 1 requests") {
		t.Errorf("log does not mention the cancel:\n%s", s.log())
	}
}

// TestServePoolAndChatPage checks that serve honours the expert flags
// (--pool-mb streams experts, which each reply's "sluice" figures show)
// and answers GET / with the chat page.
func TestServePoolAndChatPage(t *testing.T) {
	s := serve(t, "--pool-mb", "25%")
	resp := postJSON(t, s.url+"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 8, "temperature": 0})
	var got struct {
		Sluice struct {
			ExpertsResident bool  `json:"experts_resident"`
			ExpertMisses    int64 `json:"expert_misses"`
		} `json:"sluice"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || got.Sluice.ExpertsResident {
		t.Errorf("reply figures with a 25%% pool: %+v (%v)", got, err)
	}
	resp.Body.Close()
	page, err := http.Get(s.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer page.Body.Close()
	b, _ := io.ReadAll(page.Body)
	if page.StatusCode != 200 || !strings.Contains(string(b), "<title>sluice chat</title>") {
		t.Errorf("GET /: %d %.200s", page.StatusCode, b)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.wait(t)
	if !strings.Contains(s.log(), "chat in a browser at "+s.url+"/") || !strings.Contains(s.log(), "from --pool-mb") {
		t.Errorf("serve did not say where the chat page is or ignored --pool-mb:\n%s", s.log())
	}
}
