package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
)

const nightlyWorkflow = `name: nightly
input:
  type: object
  properties:
    region: {type: string}
schedule:
  - cron: "0 3 * * *"
    timezone: Europe/Berlin
    input: {region: eu}
  - cron: "@every 10m"
steps:
  - name: report
    handler: echo
`

func (b *testBundle) schedules(t *testing.T) []view.Schedule {
	t.Helper()
	r := b.run(t, "", "schedules", "--json", "--next", "2")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	var list []view.Schedule
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
	return list
}

func TestSchedulesListPauseResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.yaml"), []byte(nightlyWorkflow), 0o644))
	b.env["DAGRUN_WORKFLOWS"] = dir

	list := b.schedules(t)
	require.Len(t, list, 2)
	first := list[0]
	require.Equal(t, "nightly", first.Workflow)
	require.Equal(t, 0, first.Index)
	require.Equal(t, "0 3 * * *", first.Cron)
	require.Equal(t, "Europe/Berlin", first.Timezone)
	require.Equal(t, "skip", first.Overlap)
	require.Equal(t, "0s", first.Catchup)
	require.False(t, first.Paused)
	require.Nil(t, first.LastInstance)
	require.Len(t, first.Next, 2)
	next, err := time.Parse(time.RFC3339, first.Next[0])
	require.NoError(t, err)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.Equal(t, 3, next.In(berlin).Hour(), "03:00 in Berlin")
	require.Equal(t, "UTC", list[1].Timezone)

	r := b.run(t, "", "schedules")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^WORKFLOW\s+INDEX\s+CRON\s+TIMEZONE\s+NEXT\s+PAUSED\s+LAST INSTANCE\s+STATUS$`, r.stdout)
	require.Regexp(t, `(?m)^nightly\s+0\s+0 3 \* \* \*\s+Europe/Berlin\s+\d{4}-\d\d-\d\d 03:00:00 CES?T\s+no\s+-\s+-$`, r.stdout)

	r = b.run(t, "", "schedule", "pause", "nightly", "1")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "paused schedule 1 of nightly\n", r.stdout)
	list = b.schedules(t)
	require.False(t, list[0].Paused)
	require.True(t, list[1].Paused, "the pause is stored: the next process sees it")

	r = b.run(t, "", "schedule", "pause", "nightly")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "paused every schedule of nightly\n", r.stdout)
	list = b.schedules(t)
	require.True(t, list[0].Paused && list[1].Paused)

	r = b.run(t, "", "schedule", "resume", "nightly", "0")
	require.Equal(t, app.ExitOK, r.code, r.stderr)
	require.Equal(t, "resumed schedule 0 of nightly\n", r.stdout)
	list = b.schedules(t)
	require.False(t, list[0].Paused)
	require.True(t, list[1].Paused)
}

func TestScheduleCommandErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.yaml"), []byte(nightlyWorkflow), 0o644))
	b.env["DAGRUN_WORKFLOWS"] = dir
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"schedule", "pause", "nightly", "2"}, "dagrun: workflow nightly has no schedule 2: its schedules are numbered 0 to 1\n"},
		{[]string{"schedule", "pause", "nightly", "first"}, "dagrun: invalid INDEX \"first\": use the schedule's number from `dagrun schedules` (0 for the first)\n"},
		{[]string{"schedule", "resume", "nope"}, "dagrun: unknown workflow \"nope\" (available: nightly)\n"},
		{[]string{"schedule", "pause"}, "dagrun: usage: dagrun schedule pause WORKFLOW [INDEX] (got 0 arguments)\n"},
		{[]string{"schedule"}, "dagrun: usage: dagrun schedule pause|resume WORKFLOW [INDEX]\n"},
		{[]string{"schedules", "--next", "0"}, "dagrun: invalid --next 0: must be from 1 to 100\n"},
	}
	for _, tc := range cases {
		r := b.run(t, "", tc.args...)
		require.Equal(t, app.ExitUsage, r.code, "%v", tc.args)
		require.Equal(t, tc.want, r.stderr, "%v", tc.args)
		require.Empty(t, r.stdout)
	}
	for _, s := range b.schedules(t) {
		require.False(t, s.Paused, "a refused command writes nothing")
	}
}

// lockedBuffer is a bytes.Buffer safe to read while a command writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestWorkerRunsTheScheduler runs `dagrun worker` with and without
// --no-schedules until its log says what it did about the scheduler.
func TestWorkerRunsTheScheduler(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"worker"}, "scheduler started"},
		{[]string{"worker", "--no-schedules"}, "dagrun scheduler off (--no-schedules)"},
		{[]string{"serve", "--addr", "127.0.0.1:0"}, "scheduler started"},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--no-schedules"}, "dagrun scheduler off (--no-schedules)"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.yaml"), []byte(nightlyWorkflow), 0o644))
			b.env["DAGRUN_WORKFLOWS"] = dir
			ctx, cancel := context.WithCancel(t.Context())
			var stderr lockedBuffer
			done := make(chan int, 1)
			go func() {
				done <- app.Run(ctx, tc.args, &app.IO{Stdout: io.Discard, Stderr: &stderr,
					Getenv: func(name string) string { return b.env[name] }}, b.registry)
			}()
			require.Eventually(t, func() bool { return strings.Contains(stderr.String(), tc.want) }, 20*time.Second, 10*time.Millisecond)
			cancel()
			require.Equal(t, app.ExitOK, <-done, stderr.String())
			if strings.Contains(tc.want, "off") {
				require.NotContains(t, stderr.String(), "scheduler started")
			}
		})
	}
}

// A scheduled workflow whose file has errors is not listed, and schedules
// says so on stderr rather than seeming to have nothing to list.
func TestSchedulesNamesInvalidWorkflows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.yaml"), []byte(nightlyWorkflow), 0o644))
	broken := strings.Replace(nightlyWorkflow, "handler: echo", "handler: ech", 1)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "weekly.yaml"), []byte(strings.Replace(broken, "name: nightly", "name: weekly", 1)), 0o644))
	b.env["DAGRUN_WORKFLOWS"] = dir

	for _, args := range [][]string{{"schedules"}, {"schedules", "--json"}} {
		r := b.run(t, "", args...)
		require.Equal(t, app.ExitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "nightly")
		require.NotContains(t, r.stdout, "weekly")
		require.True(t, strings.HasPrefix(r.stderr, "dagrun: warning: workflow weekly is left out: "+filepath.Join(dir, "weekly.yaml")+":"), r.stderr)
		require.Contains(t, r.stderr, `handler "ech" is not registered`)
		require.True(t, strings.HasSuffix(r.stderr, "; list every error with: dagrun validate "+filepath.Join(dir, "weekly.yaml")+"\n"), r.stderr)
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), r.stderr)
	}
}
