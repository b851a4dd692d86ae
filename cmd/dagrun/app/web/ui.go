package web

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"sync"
	"time"
)

// The web UI is one HTML shell (shellSource) and the files beside it
// (uiFiles): a stylesheet, a script and an icon, no third-party code and
// nothing fetched from elsewhere. The shell holds no data; the script
// fetches everything from the API and renders it with textContent, so no
// stored value can become markup.
//
//go:embed ui/app.css ui/app.js ui/favicon.svg
var uiFiles embed.FS

// shellSource is a template only for whether the shell offers to sign out
// (with a token); it is served at / and nowhere else.
//
//go:embed ui/index.html
var shellSource string

// shellTemplate is parsed at first use, not at init, which every dagrun
// process would pay for.
var shellTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("shell").Parse(shellSource))
})

func (s *Server) uiRoutes() {
	assets, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embed pattern above guarantees the folder
	}
	var shell bytes.Buffer
	if err := shellTemplate().Execute(&shell, struct{ SignOut bool }{s.protected()}); err != nil {
		panic(err) // a fixed template and a bool: a bug
	}
	files := http.FileServerFS(assets)
	// Pages are addressed by the URL fragment (#/instances/ID), so the
	// server only ever serves the shell at / and the assets beside it.
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		noCache(w)
		http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(shell.Bytes()))
	})
	s.mux.Handle("GET /ui/", http.StripPrefix("/ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// No directory listings (the file names are not an API), and a
		// missing file is answered as any unknown route is, in JSON.
		if info, err := fs.Stat(assets, r.URL.Path); r.URL.Path == "" || err != nil || info.IsDir() {
			writeError(w, http.StatusNotFound, "no route "+r.Method+" /ui/"+r.URL.Path)
			return
		}
		noCache(w)
		files.ServeHTTP(w, r)
	})))
	// Without it the mux would redirect /ui to /ui/, itself not found.
	s.mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+r.Method+" /ui: the web UI is at /")
	})
}

// noCache makes browsers revalidate the UI, so an upgraded binary's UI
// is picked up on the next load (embedded files carry no modification time
// to revalidate against, so this costs a small re-download).
func noCache(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-cache")
}
