package e2e

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInterruptedStart interrupts a following start whose in-process
// worker runs a long step. The first signal says at once that the start
// stopped following and that the step may finish; the process then exits
// 130 (interrupted, not "the instance failed") when the step is done, or
// at once on a second signal: killed by it, or, when the process started
// with SIGINT ignored (as a background job of a non-interactive shell
// does), exiting 130.
func TestInterruptedStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		ignored bool // the process starts with SIGINT ignored
		second  bool
		code    int
	}{
		{name: "StepFinishes", code: 130},
		{name: "SecondSignal", second: true, code: -1},
		{name: "SecondSignalIgnoredAtStart", ignored: true, second: true, code: 130},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
				_, _ = w.Write([]byte(`{}`))
			}))
			t.Cleanup(slow.Close)
			t.Cleanup(func() { close(release) })
			e := newEnv(t, filepath.Join(t.TempDir(), "a.db"), map[string]string{"slow.yaml": `name: slow
steps:
  - {name: s, handler: http, input: {url: "` + slow.URL + `"}, timeout: 1m}
`})
			var p *process
			if tc.ignored {
				p = e.spawnBinary(t, "/bin/sh", "-c", `trap "" INT; exec "$0" "$@"`, binary, "start", "slow")
			} else {
				p = e.spawn(t, "start", "slow")
			}
			select {
			case <-arrived:
			case <-time.After(30 * time.Second):
				t.Fatalf("the step never ran; stderr:\n%s", p.stderr.String())
			}
			p.signal(t, syscall.SIGINT)
			waitFor(t, 10*time.Second, "the start to say it stopped following", func() bool {
				return strings.Contains(p.stderr.String(), "stopped following instance")
			})
			require.True(t, p.running(), "the running step gets its grace period")
			if tc.second {
				p.signal(t, syscall.SIGINT)
				// Within half the in-process worker's grace of 10 s: its end
				// would end the process too.
				require.Equal(t, tc.code, p.wait(t, 5*time.Second), "a second signal ends the process at once; stderr:\n%s", p.stderr.String())
				return
			}
			release <- struct{}{}
			require.Equal(t, tc.code, p.wait(t, 10*time.Second), "an interrupted start's exit code; stderr:\n%s", p.stderr.String())
			require.Contains(t, p.stderr.String(), "interrupt again to exit now")
		})
	}
}
