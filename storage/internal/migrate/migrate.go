// Package migrate reads versioned SQL migration files for the storage
// backends. Each backend embeds its own native SQL and applies it in its own
// transaction; this package only turns the files into an ordered, validated
// list so that every backend names and orders migrations the same way.
//
// It may import only the standard library.
package migrate

import (
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
)

// Migration is one schema version.
type Migration struct {
	// Version is the number in the file name, starting at 1.
	Version int
	// Name is the file name, e.g. "0001_init.sql".
	Name string
	// SQL is the file's content.
	SQL string
}

// fileName is NNNN_words.sql: zero-padded so that lexical order is version
// order, which keeps directory listings and version order the same.
var fileName = regexp.MustCompile(`^([0-9]{4})_[a-z0-9_]+\.sql$`)

// Read returns the migrations in dir of fsys, ordered by version. It fails on
// a misnamed .sql file, a duplicate or zero version, or a gap, so that a
// mistake is caught by the first test rather than in production.
func Read(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: read %s: %w", dir, err)
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migrate: %s: name must look like 0001_init.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1]) // the regexp guarantees digits
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrate: %s: expected version %04d (versions start at 1 without gaps or duplicates)", m.Name, i+1)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("migrate: no migrations in %s", dir)
	}
	return out, nil
}
