//go:build unix

package dag

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoadDirSkipsPastANamedPipe: a named pipe called *.yaml would block
// every command that loads the folder until something wrote to it; it is
// an error at its name instead, beside the workflows that load, and so is
// a link to a folder.
func TestLoadDirSkipsPastANamedPipe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "alpha.yaml"), []byte("name: alpha\nsteps:\n  - name: a\n    handler: echo\n"), 0o644))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(dir, "sub"), filepath.Join(dir, "linked.yaml")))

	wfs, err := LoadDir(dir, nil)
	require.Len(t, wfs, 1)
	require.ErrorContains(t, err, filepath.Join(dir, "pipe.yaml")+":1:1: cannot read the file: pipe.yaml is a named pipe, not a regular file: move it out of the workflows folder")
	require.ErrorContains(t, err, filepath.Join(dir, "linked.yaml")+":1:1: cannot read the file: linked.yaml is a folder, not a regular file")
}
