package app

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestItemCounts: a forEach step's counts on one line; a step without
// items says so rather than "0/0 completed", which beside a step that
// failed before reading its list reads as a success.
func TestItemCounts(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		counts storage.ItemCounts
		want   string
	}{
		{storage.ItemCounts{}, "no items"},
		{storage.ItemCounts{Total: 3, Completed: 3}, "3/3 completed"},
		{storage.ItemCounts{Total: 10, Completed: 5, Running: 2, Pending: 1, Failed: 1, Cancelled: 1}, "5/10 completed, 2 running, 1 pending, 1 failed, 1 cancelled"},
	} {
		require.Equal(t, tt.want, itemCounts(&tt.counts))
	}
}
