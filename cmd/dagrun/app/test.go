package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun/cmd/dagrun/dagruntest"
	"github.com/dagrun/dagrun/dag"
)

func (c *cli) testCommand() *cobra.Command {
	var (
		run    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "test [FILE...]",
		Short: "Run workflow tests (every tests/*_test.yaml of --workflows by default) against mocked handlers, in memory, on a fake clock",
		Long: `Run workflow tests: each case starts its workflow on a throwaway in-memory
database whose clock jumps to the next due time (so backoffs, sleeps and wait
timeouts take no time), answers its steps with the case's mocks or this binary's
handlers, and checks the expectations. One line per case, a diff on failure.
Exit 0 when every case passed, 1 when one failed, 2 for an invalid test or
workflow file (FILE:LINE:COL: message), which wins over 1. An invalid
workflow file stops only its own workflow's cases, an invalid test file
only its own; the others run, and the command exits 2 for them afterwards
(for a broken workflow, in a run of the whole folder).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var filter *regexp.Regexp
			if run != "" {
				var err error
				if filter, err = regexp.Compile(run); err != nil {
					return usageError(fmt.Errorf("invalid --run %q: %v", run, err))
				}
			}
			workflows, err := whileRunning(cmd.Context(), func() ([]*dag.Workflow, error) {
				return dagruntest.LoadWorkflows(c.workflowsDir)
			})
			// An invalid workflow file stops only the cases of its own
			// workflow (their test file fails to parse, naming it); the
			// others run. Its errors are printed first; a run of the
			// whole folder still exits 2 for them, one of named files
			// only when they need it.
			var broken dag.ErrorList
			if err != nil && (!errors.As(err, &broken) || len(workflows) == 0) {
				return c.printFileErrors(err, "set --workflows or DAGRUN_WORKFLOWS")
			}
			for _, e := range broken {
				fmt.Fprintln(c.io.Stderr, e.Error())
			}
			files := args
			if len(files) == 0 {
				if files, err = dagruntest.DefaultFiles(c.workflowsDir); err != nil {
					return usageError(err)
				}
				if len(files) == 0 {
					dir := filepath.Join(c.workflowsDir, dagruntest.TestsFolder)
					return usageError(fmt.Errorf("no test files in %s: write cases in %s/WORKFLOW%s, or name the files to run", dir, dir, dagruntest.FileSuffix))
				}
			}
			// An invalid test file stops only its own cases, as an invalid
			// workflow file does: its errors come first, the other files'
			// cases run, and the command exits 2 for it after them.
			parsed, err := dagruntest.ParseFiles(files, workflows)
			var invalid dag.ErrorList
			if err != nil && (!errors.As(err, &invalid) || len(parsed) == 0) {
				if asJSON {
					_ = writeTestJSON(c.io.Stdout, nil, errorLines(err))
				}
				return c.printFileErrors(err, "check the test file paths")
			}
			for _, e := range invalid {
				fmt.Fprintln(c.io.Stderr, e.Error())
			}
			runner, err := dagruntest.NewRunner(c.registry, workflows)
			if err != nil {
				return err
			}
			defer runner.Close()
			began := time.Now()
			results := runner.RunFiles(cmd.Context(), parsed, filter, func(r *dagruntest.Result) {
				if !asJSON {
					dagruntest.WriteResult(c.io.Stdout, r)
				}
			})
			if err := cmd.Context().Err(); err != nil {
				return err
			}
			if len(results) == 0 {
				return usageError(fmt.Errorf("--run %q matches no case (a case's name is WORKFLOW/CASE)", run))
			}
			if asJSON {
				if err := writeTestJSON(c.io.Stdout, results, errorLines(slices.Concat(broken, invalid))); err != nil {
					return err
				}
			} else {
				dagruntest.WriteSummary(c.io.Stdout, results, time.Since(began))
			}
			// An invalid file is the first thing to fix: it wins over a
			// failed case.
			if len(broken) > 0 && len(args) == 0 || len(invalid) > 0 {
				return &exitError{code: ExitUsage}
			}
			for _, r := range results {
				if !r.Passed() {
					return &exitError{code: ExitFailed}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "run only the cases whose WORKFLOW/CASE name matches this regular expression")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the results as one JSON object instead of lines (for CI)")
	return cmd
}

// testCaseJSON is one case's result in dagrun test --json.
type testCaseJSON struct {
	Name       string   `json:"name"`
	Workflow   string   `json:"workflow"`
	Case       string   `json:"case"`
	File       string   `json:"file"`
	Line       int      `json:"line"`
	Passed     bool     `json:"passed"`
	DurationMs float64  `json:"durationMs"`
	Failures   []string `json:"failures"`
}

// errorLines is err's file errors as lines, FILE:LINE:COL: message.
func errorLines(err error) []string {
	var list dag.ErrorList
	if !errors.As(err, &list) {
		if err == nil {
			return nil
		}
		return []string{err.Error()}
	}
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.Error()
	}
	return out
}

// writeTestJSON prints {"passed": N, "failed": M, "cases": [...]}, and
// "errors": the invalid files' errors as validate prints them, when any.
func writeTestJSON(w io.Writer, results []*dagruntest.Result, errs []string) error {
	out := struct {
		Passed int            `json:"passed"`
		Failed int            `json:"failed"`
		Cases  []testCaseJSON `json:"cases"`
		Errors []string       `json:"errors,omitempty"`
	}{Cases: make([]testCaseJSON, len(results)), Errors: errs}
	for i, r := range results {
		if r.Passed() {
			out.Passed++
		} else {
			out.Failed++
		}
		out.Cases[i] = testCaseJSON{
			Name: r.Name(), Workflow: r.Workflow, Case: r.Case.Name, File: r.File, Line: r.Case.Line,
			Passed: r.Passed(), DurationMs: float64(r.Duration.Microseconds()) / 1000, Failures: r.Failures,
		}
		if out.Cases[i].Failures == nil {
			out.Cases[i].Failures = []string{}
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// printFileErrors prints a list of file errors one per line, as validate
// does, and makes the command exit 2; any other error is one line ending
// with the hint.
func (c *cli) printFileErrors(err error, hint string) error {
	var list dag.ErrorList
	if !errors.As(err, &list) {
		return usageError(fmt.Errorf("%w (%s)", err, hint))
	}
	for _, e := range list {
		fmt.Fprintln(c.io.Stderr, e.Error())
	}
	return &exitError{code: ExitUsage}
}
