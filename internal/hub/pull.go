package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// MarkerFile, in a pulled directory, records what was pulled once every
// selected file is whole and verified; its presence is what makes a
// directory complete.
const MarkerFile = ".sluice-pull.json"

// DefaultInclude selects what a checkpoint needs at the repository's top
// level: configs, tokenizer files, chat templates and safetensors weights
// (other formats a repository may also hold, such as .bin, .gguf or .onnx,
// are left out).
var DefaultInclude = []string{"*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"}

// marker is MarkerFile's content.
type marker struct {
	Repo     string   `json:"repo"`
	Revision string   `json:"revision"`
	Commit   string   `json:"commit"`
	Include  []string `json:"include"`
	Files    []string `json:"files"`
}

// Complete reports whether dir holds a finished pull.
func Complete(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, MarkerFile))
	if err != nil {
		return false
	}
	var m marker
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	for _, f := range m.Files {
		if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f))); err != nil {
			return false
		}
	}
	return true
}

// Dir is where a pull of ref lands under the cache directory:
// CACHE/hub/OWNER--NAME, with "@REVISION" added for a revision other than
// main ("/" in it become "--").
func Dir(cache string, ref Ref) string {
	name := strings.ReplaceAll(ref.Repo, "/", "--")
	if rev := ref.Revision; rev != "" && rev != "main" {
		name += "@" + strings.ReplaceAll(rev, "/", "--")
	}
	return filepath.Join(cache, "hub", name)
}

// Pull downloads the files of ref matching include (DefaultInclude when
// empty) into dir and marks dir complete. Files already whole are kept;
// partial ones resume.
func (c *Client) Pull(ctx context.Context, ref Ref, include []string, dir string) (*Repo, error) {
	if len(include) == 0 {
		include = DefaultInclude
	}
	r, err := c.Info(ctx, ref)
	if err != nil {
		return nil, err
	}
	files, err := r.Select(include)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		var names []string
		for i, f := range r.Files {
			if i == 8 {
				names = append(names, "…")
				break
			}
			names = append(names, f.Path)
		}
		return nil, fmt.Errorf("no file of %s matches %s (it has: %s)", ref, strings.Join(include, ", "), strings.Join(names, ", "))
	}
	if err := c.Download(ctx, r, files, dir); err != nil {
		return nil, err
	}
	m := marker{Repo: r.Repo, Revision: r.Revision, Commit: r.Commit, Include: include}
	for _, f := range files {
		m.Files = append(m.Files, f.Path)
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	b = append(b, '\n')
	// Rewrite the marker only when it changes: a packed copy in the cache is
	// keyed on the directory's listing, modification times included.
	name := filepath.Join(dir, MarkerFile)
	if old, err := os.ReadFile(name); err != nil || !bytes.Equal(old, b) {
		if err := os.WriteFile(name+".tmp", b, 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(name+".tmp", name); err != nil {
			return nil, err
		}
	}
	return r, nil
}
