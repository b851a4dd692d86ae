package app_test

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

// TestBenchMap: the map workload runs one instance of N forEach items to
// completion, and the instance object it reports stays small however many
// items there are (the items are paged, and a long output list is left
// out).
func TestBenchMap(t *testing.T) {
	t.Parallel()
	for _, items := range []int{10, 15000} {
		t.Run(strconv.Itoa(items), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			res := b.run(t, "", "bench", "--workload", "map", "--instances", strconv.Itoa(items))
			require.Equal(t, 0, res.code, res.stderr)
			require.Contains(t, res.stdout, "workload=map backend=sqlite items="+strconv.Itoa(items)+" ")
			require.Contains(t, res.stdout, "status=completed")
			m := regexp.MustCompile(`instance_json_bytes=(\d+)`).FindStringSubmatch(res.stdout)
			require.NotNil(t, m, res.stdout)
			size, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			require.Less(t, size, view.MaxInlineItemsOutput+16<<10, "the instance object of %d items", items)
		})
	}
}
