// Package dagruntest runs workflow tests: YAML files of cases that start a
// workflow with an input, answer its steps' handlers with mocks (an output,
// an error, a permanent error, a reply per attempt, or the real handler),
// send signals, and check the instance's status and output, its steps'
// statuses, attempts, inputs and outputs, and the order of its events.
//
// Each case runs the real engine (planner, expressions, retries, forEach,
// waits) through dagrun.Engine.Drive, on a throwaway in-memory SQLite
// store whose clock is fake: when nothing is ready, the clock jumps to the
// next time something is due, so backoffs, durable sleeps, wait timeouts
// and schedule ticks take no time. `dagrun test` is this package on the command
// line; Go tests call [Run]:
//
//	func TestWorkflows(t *testing.T) {
//		registry := handlers.NewRegistry()
//		handlers.RegisterBuiltins(registry)
//		billing.Register(registry)
//		dagruntest.Run(t, registry, "workflows")
//	}
//
// The file format is documented in the workflows folder's README.
//
// It sits in the command's tree because it opens a store backend (SQLite),
// which only the command line and examples may import; it must not import
// the command line itself (cmd/dagrun/app imports it).
package dagruntest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
)

// TestsFolder is where a workflows folder keeps its test files, and
// FileSuffix how their names end.
const (
	TestsFolder = "tests"
	FileSuffix  = "_test.yaml"
)

// DefaultFiles lists the test files of a workflows folder: its
// tests/*_test.yaml, sorted. No folder means no files.
func DefaultFiles(workflowsDir string) ([]string, error) {
	dir := filepath.Join(workflowsDir, TestsFolder)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the tests folder: %w", err)
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), FileSuffix) && !strings.HasPrefix(e.Name(), ".") {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(files)
	return files, nil
}

// LoadWorkflows parses the workflows a test run may start. Handler names
// are not checked against a registry: a mocked step needs no handler, so a
// workflow can be tested before its handlers are written.
func LoadWorkflows(dir string) ([]*dag.Workflow, error) {
	return dag.LoadDir(dir, nil)
}

// ParseFiles parses test files; the error is a dag.ErrorList of every
// problem of every file, and the files without one are returned with it,
// for a caller to run them all the same.
func ParseFiles(paths []string, workflows []*dag.Workflow) ([]*File, error) {
	var (
		files []*File
		errs  dag.ErrorList
	)
	for _, path := range paths {
		f, err := ParseFile(path, workflows)
		var list dag.ErrorList
		switch {
		case errors.As(err, &list):
			errs = append(errs, list...)
		case err != nil:
			// Positioned at the file's start, as validate places an
			// unreadable workflow file.
			errs = append(errs, &dag.Error{File: path, Line: 1, Col: 1, Msg: err.Error()})
		default:
			files = append(files, f)
		}
	}
	if len(errs) > 0 {
		return files, errs
	}
	return files, nil
}

// WriteResult prints one line for a case, ok or FAIL with its name and
// duration, and under a failure what differed, indented.
func WriteResult(w io.Writer, r *Result) {
	status := "ok  "
	if !r.Passed() {
		status = "FAIL"
	}
	fmt.Fprintf(w, "%s %s (%s)\n", status, r.Name(), roundDuration(r.Duration))
	for _, f := range r.Failures {
		for _, line := range strings.Split(f, "\n") {
			fmt.Fprintf(w, "    %s\n", line)
		}
	}
}

// WriteSummary prints the closing line of a run.
func WriteSummary(w io.Writer, results []*Result, elapsed time.Duration) {
	failed := 0
	for _, r := range results {
		if !r.Passed() {
			failed++
		}
	}
	cases := "cases"
	if len(results) == 1 {
		cases = "case"
	}
	if failed > 0 {
		fmt.Fprintf(w, "FAIL: %d of %d %s failed (%s)\n", failed, len(results), cases, roundDuration(elapsed))
		return
	}
	fmt.Fprintf(w, "PASS: %d %s (%s)\n", len(results), cases, roundDuration(elapsed))
}

func roundDuration(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Microsecond)
}

// Run runs test files of the workflows in workflowsDir, each case as a
// subtest named WORKFLOW/CASE, with registry's handlers for real: true
// steps. Without files it runs the folder's tests/*_test.yaml, and fails
// when there are none. An invalid workflow or test file fails t with every
// error as FILE:LINE:COL: message.
func Run(t *testing.T, registry *handlers.Registry, workflowsDir string, files ...string) {
	t.Helper()
	workflows, err := LoadWorkflows(workflowsDir)
	if err != nil {
		t.Fatalf("dagruntest: invalid workflows:\n%v", err)
	}
	if len(files) == 0 {
		if files, err = DefaultFiles(workflowsDir); err != nil {
			t.Fatalf("dagruntest: %v", err)
		}
		if len(files) == 0 {
			t.Fatalf("dagruntest: no test files in %s", filepath.Join(workflowsDir, TestsFolder))
		}
	}
	parsed, err := ParseFiles(files, workflows)
	if err != nil {
		t.Fatalf("dagruntest: invalid test files:\n%v", err)
	}
	runner, err := NewRunner(registry, workflows)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runner.Close)
	for _, f := range parsed {
		for _, c := range f.Cases {
			t.Run(f.Workflow+"/"+c.Name, func(t *testing.T) {
				r := runner.RunCase(context.Background(), f, c)
				for _, msg := range r.Failures {
					t.Errorf("%s:%d:%d: %s", f.Path, c.Line, c.Col, msg)
				}
			})
		}
	}
}
