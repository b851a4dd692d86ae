package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// freshYAML is a workflow a test writes into a running process's folder:
// its one step echoes version.
func freshYAML(description, version string) string {
	return "name: fresh\ndescription: " + description + "\nsteps:\n  - name: one\n    handler: echo\n    input: {version: " + version + "}\n"
}

// TestServeFollowsTheWorkflowsFolder: a workflow added to, edited in or
// removed from the folder of a running `dagrun serve` is served as the
// folder has it now, without a restart; a file with errors is refused
// with them, as at start; an instance started before an edit keeps its
// definition.
func TestServeFollowsTheWorkflowsFolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	server, base := serveProcess(t, e)
	path := filepath.Join(e.workflows, "fresh.yaml")

	// workflow reads GET /api/workflows/fresh until it answers want.
	workflow := func(want int, description string) map[string]any {
		t.Helper()
		var detail map[string]any
		require.Eventually(t, func() bool {
			resp, body := apiCall(t, http.MethodGet, base+"/api/workflows/fresh", "")
			if resp.StatusCode != want {
				return false
			}
			detail = nil
			require.NoError(t, json.Unmarshal([]byte(body), &detail), body)
			return want != http.StatusOK || detail["description"] == description
		}, 30*time.Second, 20*time.Millisecond, "GET /api/workflows/fresh never answered %d %q", want, description)
		return detail
	}
	resp, body := apiCall(t, http.MethodGet, base+"/api/workflows/fresh", "")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)

	require.NoError(t, os.WriteFile(path, []byte(freshYAML("first", "1")), 0o644))
	first := workflow(http.StatusOK, "first")
	require.Eventually(t, func() bool {
		_, metrics := apiCall(t, http.MethodGet, base+"/metrics", "")
		return strings.Contains(metrics, `dagrun_instances_started_total{workflow="fresh"} 0`)
	}, 30*time.Second, 20*time.Millisecond, "the added workflow's series start at zero")
	resp, body = apiCall(t, http.MethodPost, base+"/api/workflows/fresh/instances", `{"input": {}}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	var started instance
	require.NoError(t, json.Unmarshal([]byte(body), &started))

	// An edit, written as editors do: a temporary file renamed over it.
	tmp := filepath.Join(e.workflows, ".fresh.yaml.swp")
	require.NoError(t, os.WriteFile(tmp, []byte(freshYAML("second", "2")), 0o644))
	require.NoError(t, os.Rename(tmp, path))
	second := workflow(http.StatusOK, "second")
	require.NotEqual(t, first["hash"], second["hash"])
	// The instance started before the edit runs under its definition.
	worker := e.spawn(t, "worker", "--no-schedules")
	var ran instance
	require.Eventually(t, func() bool {
		require.NoError(t, json.Unmarshal([]byte(e.mustRun(t, "status", started.ID, "--json").stdout), &ran))
		return ran.Status == "completed"
	}, 30*time.Second, 50*time.Millisecond, "the instance did not complete:\n%s", worker.stderr.String())
	require.JSONEq(t, `{"version": 1}`, string(ran.Steps[0].Output))

	// Errors: refused with them, as a file with errors is at start.
	require.NoError(t, os.WriteFile(path, []byte("name: fresh\nsteps:\n  - name: one\n    handler: nope\n"), 0o644))
	detail := workflow(http.StatusUnprocessableEntity, "")
	require.Contains(t, detail["error"], "fresh.yaml:4:14")
	// The log names the workflow left out and its error, and says when
	// its file is gone.
	require.Regexp(t, regexp.MustCompile(`workflow left out: its file has errors" workflow=fresh error="\S*fresh.yaml:4:14: `), server.stderr.String())

	require.NoError(t, os.Remove(path))
	workflow(http.StatusNotFound, "")
	require.Eventually(t, func() bool {
		return regexp.MustCompile(`workflows reloaded.* removed="" leftOut=""`).MatchString(server.stderr.String())
	}, 30*time.Second, 20*time.Millisecond, "no reload logged once the broken file was removed:\n%s", server.stderr.String())
	require.Regexp(t, regexp.MustCompile(`workflows reloaded.*added=fresh`), server.stderr.String())
	require.Regexp(t, regexp.MustCompile(`workflows reloaded.*changed=fresh`), server.stderr.String())
	require.Regexp(t, regexp.MustCompile(`workflows reloaded.*removed=fresh`), server.stderr.String())
}

// TestWorkerSchedulesAWorkflowAddedWhileItRuns: a scheduled workflow
// dropped into a running worker's folder gets its ticks started, and run,
// without a restart.
func TestWorkerSchedulesAWorkflowAddedWhileItRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, filepath.Join(t.TempDir(), "dagrun.db"), nil)
	p := e.spawn(t, "worker")
	require.Eventually(t, func() bool { return strings.Contains(p.stderr.String(), "dagrun worker started") }, 30*time.Second, 10*time.Millisecond)

	src := "name: ticking\nschedule:\n  - cron: \"@every 1s\"\nsteps:\n  - name: one\n    handler: echo\n"
	require.NoError(t, os.WriteFile(filepath.Join(e.workflows, "ticking.yaml"), []byte(src), 0o644))
	require.Eventually(t, func() bool {
		var list []instance
		out := e.mustRun(t, "list", "--workflow", "ticking", "--status", "completed", "--json").stdout
		require.NoError(t, json.Unmarshal([]byte(out), &list), out)
		return len(list) > 0
	}, 30*time.Second, 100*time.Millisecond, "no tick of the added schedule completed:\n%s", p.stderr.String())
	require.Contains(t, p.stderr.String(), "added=ticking")
}

// TestServeFollowsAFolderReplacedUnderIt: a deploy that switches the
// workflows symlink to another release's folder, and a folder deleted and
// made again, are followed as an edit is: a watch alone stays on the
// folder it was added on.
func TestServeFollowsAFolderReplacedUnderIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	release := func(name, description string) {
		t.Helper()
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(path, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(path, "fresh.yaml"), []byte(freshYAML(description, "1")), 0o644))
	}
	release("release-1", "one")
	link := filepath.Join(dir, "workflows")
	require.NoError(t, os.Symlink("release-1", link))
	e := &env{dir: dir, db: filepath.Join(dir, "dagrun.db"), workflows: link}
	server, base := serveProcess(t, e)
	served := func(status int, description string) {
		t.Helper()
		require.Eventually(t, func() bool {
			resp, body := apiCall(t, http.MethodGet, base+"/api/workflows/fresh", "")
			var detail map[string]any
			return resp.StatusCode == status && (status != http.StatusOK || json.Unmarshal([]byte(body), &detail) == nil && detail["description"] == description)
		}, 30*time.Second, 20*time.Millisecond, "GET /api/workflows/fresh never answered %d %q:\n%s", status, description, server.stderr.String())
	}
	served(http.StatusOK, "one")

	release("release-2", "two")
	next := filepath.Join(dir, "workflows.next")
	require.NoError(t, os.Symlink("release-2", next))
	require.NoError(t, os.Rename(next, link))
	served(http.StatusOK, "two")

	require.NoError(t, os.RemoveAll(filepath.Join(dir, "release-2")))
	served(http.StatusNotFound, "")
	require.Eventually(t, func() bool {
		return strings.Contains(server.stderr.String(), "the workflows folder cannot be read")
	}, 30*time.Second, 20*time.Millisecond, "no warning of the folder gone:\n%s", server.stderr.String())
	release("release-2", "three")
	served(http.StatusOK, "three")
}
