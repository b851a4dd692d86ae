package storage_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/storage"
)

// TestChildError: a child that failed in a step is named with the path of
// steps down to the first error, however deep, in one line.
func TestChildError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, msg, want string
		status          storage.InstanceStatus
	}{
		{"cancelled", "stopped by hand", "child instance C was cancelled", storage.InstanceCancelled},
		{"failed in a step", "step boom failed: GET http://x: refused",
			"child instance C failed in step boom: GET http://x: refused", storage.InstanceFailed},
		{"failed in a step, no error given", "step boom failed", "child instance C failed in step boom", storage.InstanceFailed},
		{"a grandchild failed in a step", "step call3 failed: child instance G failed in step boom: GET http://x: refused",
			"child instance C failed in step call3 > boom: GET http://x: refused", storage.InstanceFailed},
		{"three levels", "step call2 failed: child instance G failed in step call3 > boom: no: really",
			"child instance C failed in step call2 > call3 > boom: no: really", storage.InstanceFailed},
		{"a grandchild failed without a step", "step call3 failed: child instance G failed: workflow timed out after 1s",
			"child instance C failed in step call3: child instance G failed: workflow timed out after 1s", storage.InstanceFailed},
		{"a grandchild cancelled", "step call3 failed: child instance G was cancelled",
			"child instance C failed in step call3: child instance G was cancelled", storage.InstanceFailed},
		{"not a step's failure", "workflow timed out after 1s", "child instance C failed: workflow timed out after 1s", storage.InstanceFailed},
		{"text that only looks like one", "step by step failed", "child instance C failed: step by step failed", storage.InstanceFailed},
	} {
		require.Equal(t, tc.want, storage.ChildError("C", tc.status, tc.msg), tc.name)
	}
}
