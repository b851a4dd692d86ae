package app

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"time"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun/cmd/dagrun/dagruntest"
	"github.com/dagrun/dagrun/dag"
)

func (c *cli) testCommand() *cobra.Command {
	var run string
	cmd := &cobra.Command{
		Use:   "test [FILE...]",
		Short: "Run workflow tests (every tests/*_test.yaml of --workflows by default) against mocked handlers, in memory, on a fake clock",
		Long: `Run workflow tests: each case starts its workflow on a throwaway in-memory
database whose clock jumps to the next due time (so backoffs, sleeps and wait
timeouts take no time), answers its steps with the case's mocks or this binary's
handlers, and checks the expectations. One line per case, a diff on failure.
Exit 0 when every case passed, 1 when one failed, 2 for an invalid test or
workflow file (FILE:LINE:COL: message).`,
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
			if err != nil {
				return c.printFileErrors(err, "set --workflows or DAGRUN_WORKFLOWS")
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
			parsed, err := dagruntest.ParseFiles(files, workflows)
			if err != nil {
				return c.printFileErrors(err, "check the test file paths")
			}
			runner, err := dagruntest.NewRunner(c.registry, workflows)
			if err != nil {
				return err
			}
			defer runner.Close()
			began := time.Now()
			results := runner.RunFiles(cmd.Context(), parsed, filter, func(r *dagruntest.Result) {
				dagruntest.WriteResult(c.io.Stdout, r)
			})
			if err := cmd.Context().Err(); err != nil {
				return err
			}
			if len(results) == 0 {
				return usageError(fmt.Errorf("--run %q matches no case (a case's name is WORKFLOW/CASE)", run))
			}
			dagruntest.WriteSummary(c.io.Stdout, results, time.Since(began))
			for _, r := range results {
				if !r.Passed() {
					return &exitError{code: ExitFailed}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "run only the cases whose WORKFLOW/CASE name matches this regular expression")
	return cmd
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
