package dagrun_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDependencyDirection keeps the package graph one-way, as the README's
// Layout section describes it: cmd/dagrun/app → dagrun → dag, handlers, storage; backends
// implement storage; only the CLI (cmd/dagrun/..., workflow tests'
// dagruntest included), examples and test helpers import a backend, and
// dagruntest, which cmd/dagrun/app imports, does not import the CLI.
func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	const mod = "github.com/dagrun/dagrun"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, mod+"/...").Output()
	require.NoError(t, err)
	forbidden := map[string][]string{
		mod:                            {mod + "/storage/sqlite", mod + "/storage/postgres", mod + "/cmd/"},
		mod + "/dag":                   {mod + "/storage", mod + "/handlers", mod + "/cmd/", mod + "\x00root"},
		mod + "/handlers":              {mod + "/storage", mod + "/dag", mod + "/cmd/", mod + "\x00root"},
		mod + "/storage":               {mod + "/dag", mod + "/handlers", mod + "/cmd/", mod + "/storage/", mod + "\x00root"},
		mod + "/storage/sqlite":        {mod + "/dag", mod + "/handlers", mod + "/cmd/", mod + "/storage/postgres", mod + "\x00root"},
		mod + "/storage/postgres":      {mod + "/dag", mod + "/handlers", mod + "/cmd/", mod + "/storage/sqlite", mod + "\x00root"},
		mod + "/cmd/dagrun/dagruntest": {mod + "/cmd/dagrun/app", mod + "/storage/postgres"},
		mod + "/storage/storagetest":   {mod + "/storage/sqlite", mod + "/storage/postgres", mod + "/dag", mod + "/handlers", mod + "\x00root"},
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		rules, ok := forbidden[pkg]
		if !ok {
			continue
		}
		checked++
		for _, imp := range imports {
			for _, rule := range rules {
				bad := strings.HasPrefix(imp, rule) && rule != ""
				if rule == mod+"\x00root" {
					bad = imp == mod // the engine itself
				}
				require.False(t, bad, "%s must not import %s", pkg, imp)
			}
		}
	}
	require.Equal(t, len(forbidden), checked, "every package with rules was listed")
}
