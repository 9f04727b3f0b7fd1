package server

import (
	"embed"
	"net/http"
)

// The chat page: plain HTML, CSS and JavaScript, embedded so that the binary
// serves it offline with nothing fetched from other sites.
//
//go:embed web/index.html web/chat.css web/chat.js
var webFiles embed.FS

// webTypes are the page's files by URL path, with their content types.
var webTypes = map[string][2]string{
	"/":         {"web/index.html", "text/html; charset=utf-8"},
	"/chat.css": {"web/chat.css", "text/css; charset=utf-8"},
	"/chat.js":  {"web/chat.js", "text/javascript; charset=utf-8"},
}

// servePage answers GET / and the page's assets; it reports false for
// any other path. The page itself needs no API key: it asks for one when
// the API answers 401.
func servePage(w http.ResponseWriter, r *http.Request, code *int) bool {
	f, ok := webTypes[r.URL.Path]
	if !ok {
		return false
	}
	if !allow(w, r, code, http.MethodGet, http.MethodHead) {
		return true
	}
	b, err := webFiles.ReadFile(f[0])
	if err != nil { // cannot happen: the files are embedded
		*code = http.StatusInternalServerError
		http.Error(w, err.Error(), *code)
		return true
	}
	h := w.Header()
	h.Set("Content-Type", f[1])
	// Everything the page uses comes from this server; say so to the
	// browser, which then refuses anything else.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	*code = http.StatusOK
	w.WriteHeader(*code)
	if r.Method != http.MethodHead {
		w.Write(b)
	}
	return true
}
