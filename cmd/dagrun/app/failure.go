package app

import (
	"fmt"
	"io"
	"time"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/storage"
)

// writeTimeout prints the workflow timeout, and while the instance runs,
// when it times out.
func writeTimeout(w io.Writer, inst *storage.Instance, now time.Time) {
	if inst.Timeout <= 0 {
		return
	}
	if inst.Deadline != nil {
		fmt.Fprintf(w, "Timeout:\t%s (times out at %s, %s left)\n", storage.FormatDuration(inst.Timeout),
			view.Time(*inst.Deadline), timeLeft(inst.Deadline.Sub(now)))
		return
	}
	fmt.Fprintf(w, "Timeout:\t%s\n", storage.FormatDuration(inst.Timeout))
}

// stepLabel is a step's name in the step table, onFailure steps marked.
func stepLabel(s storage.Step) string {
	if s.OnFailure {
		return s.Name + " (onFailure)"
	}
	return s.Name
}
