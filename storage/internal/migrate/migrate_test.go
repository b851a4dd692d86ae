package migrate

import (
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

func TestRead(t *testing.T) {
	t.Parallel()

	t.Run("Ordered", func(t *testing.T) {
		t.Parallel()
		fsys := fstest.MapFS{
			"m/0002_more.sql": {Data: []byte("B")},
			"m/0001_init.sql": {Data: []byte("A")},
			"m/README.md":     {Data: []byte("ignored")},
		}
		ms, err := Read(fsys, "m")
		require.NoError(t, err)
		require.Equal(t, []Migration{
			{Version: 1, Name: "0001_init.sql", SQL: "A"},
			{Version: 2, Name: "0002_more.sql", SQL: "B"},
		}, ms)
	})

	for name, files := range map[string][]string{
		"Unpadded":  {"1_init.sql"},
		"Gap":       {"0001_init.sql", "0003_x.sql"},
		"Duplicate": {"0001_init.sql", "0001_again.sql"},
		"Zero":      {"0000_init.sql"},
		"Empty":     {},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{"m/.keep": {}}
			for _, f := range files {
				fsys["m/"+f] = &fstest.MapFile{Data: []byte("x")}
			}
			_, err := Read(fsys, "m")
			require.Error(t, err)
		})
	}
}
