package web

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// uiFiles is the web UI: one HTML shell, a stylesheet and a script, no
// third-party code and nothing fetched from elsewhere. The shell holds no
// data; the script fetches everything from the API and renders it with
// textContent, so no stored value can become markup.
//
//go:embed ui/index.html ui/app.css ui/app.js ui/favicon.svg
var uiFiles embed.FS

func (s *Server) uiRoutes() {
	assets, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embed pattern above guarantees the folder
	}
	files := http.FileServerFS(assets)
	// Pages are addressed by the URL fragment (#/instances/ID), so the
	// server only ever serves the shell at / and the assets beside it.
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		noCache(w)
		http.ServeFileFS(w, r, assets, "index.html")
	})
	s.mux.Handle("GET /ui/", http.StripPrefix("/ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			// No directory listings: the file names are not an API.
			writeError(w, http.StatusNotFound, "no route "+r.Method+" /ui/"+r.URL.Path)
			return
		}
		noCache(w)
		files.ServeHTTP(w, r)
	})))
}

// noCache makes browsers revalidate the UI, so an upgraded binary's UI
// is picked up on the next load (embedded files carry no modification time
// to revalidate against, so this costs a small re-download).
func noCache(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-cache")
}
