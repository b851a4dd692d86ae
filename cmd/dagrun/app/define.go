package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dagrun/dagrun/cmd/dagrun/app/view"
	"github.com/dagrun/dagrun/dag"
)

func (c *cli) validateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate [FILE|FOLDER...]",
		Short: "Check workflow files (every file of --workflows by default, or of a folder named), printing FILE:LINE:COL: message per error",
		Long: "Validate checks each file on its own, then the workflow steps across files: the workflows they call\n" +
			"must exist (in the files and folders given, the folders of the files, and for a file named alone also the\n" +
			"--workflows folder), must not call each other in a cycle, and must get the inputs they require.\n" +
			"A folder given is checked as a --workflows folder is loaded: its calls resolve within it.",
		RunE: func(cmd *cobra.Command, args []string) error {
			files, alone, problems := c.filesToValidate(args)
			opts := &dag.ParseOptions{HandlerExists: c.registry.Has, HandlerNames: c.registry.Names}
			checked, err := whileRunning(cmd.Context(), func() ([]fileCheck, error) { return c.checkFiles(files, alone, opts), nil })
			if err != nil {
				return err
			}
			for _, f := range checked {
				if f.err == nil {
					fmt.Fprintf(c.io.Stdout, "ok %s (%s)\n", f.workflow.Name, view.Count(len(f.workflow.Steps), "step"))
					continue
				}
				problems = append(problems, fileErrors(f.file, f.err)...)
			}
			for _, e := range problems {
				// An error without a place points at the file's start, so
				// that every line reads FILE:LINE:COL: as editors expect.
				if e.Line == 0 {
					e = &dag.Error{File: e.File, Line: 1, Col: 1, Msg: e.Msg}
				}
				fmt.Fprintln(c.io.Stderr, e.Error())
			}
			if len(problems) > 0 {
				return &exitError{code: ExitUsage}
			}
			return nil
		},
	}
}

// filesToValidate lists the files validate checks: args, with a folder
// standing for its workflow files, or the --workflows folder's. alone
// tells whether a file was named on its own rather than through a folder.
// A folder it cannot list, or that holds no workflow file, is a problem of
// its own; the other arguments are still checked.
func (c *cli) filesToValidate(args []string) (files []string, alone bool, problems dag.ErrorList) {
	if len(args) == 0 {
		files, err := workflowFiles(c.workflowsDir)
		if err != nil {
			return nil, false, dag.ErrorList{folderProblem(c.workflowsDir, err, "set --workflows or DAGRUN_WORKFLOWS to the folder of your workflow files")}
		}
		return files, false, nil
	}
	seen := map[string]bool{}
	add := func(file string) {
		if key := filepath.Clean(file); !seen[key] { // a file named twice is one file
			seen[key] = true
			files = append(files, file)
		}
	}
	for _, arg := range args {
		info, err := os.Stat(arg)
		if err == nil && info.IsDir() {
			inFolder, err := workflowFiles(arg)
			if err != nil {
				problems = append(problems, folderProblem(arg, err, "name a folder or files that hold workflows"))
			}
			for _, f := range inFolder {
				add(f)
			}
			continue
		}
		if errors.Is(err, fs.ErrNotExist) && !dag.WorkflowFile(filepath.Base(arg)) {
			// A mistyped folder, most likely: not a file to rename.
			problems = append(problems, &dag.Error{File: arg, Line: 1, Col: 1, Msg: "no such file or folder; check the path"})
			continue
		}
		add(arg)
		alone = true
	}
	return files, alone, problems
}

// errNoWorkflowFiles is workflowFiles' answer for a folder that holds no
// workflow file.
var errNoWorkflowFiles = errors.New("no .yaml or .yml files in this folder")

// readableFix is what to do about a file or folder dagrun may not read.
const readableFix = "make it readable by the user dagrun runs as"

// folderProblem is validate's error for a folder it cannot take workflow
// files from; fix says what to do unless a permission is what is wrong.
func folderProblem(dir string, err error, fix string) *dag.Error {
	msg := errNoWorkflowFiles.Error()
	if !errors.Is(err, errNoWorkflowFiles) {
		msg = "cannot read the folder: " + systemReason(err)
		if errors.Is(err, fs.ErrPermission) {
			fix = readableFix
		}
	}
	return &dag.Error{File: dir, Line: 1, Col: 1, Msg: msg + "; " + fix}
}

// fileErrors are the errors of a workflow file as validate prints them:
// those of its content as they are, and a file it cannot read as one error
// at its start that says why without repeating the path.
func fileErrors(file string, err error) dag.ErrorList {
	var list dag.ErrorList
	if errors.As(err, &list) {
		return list
	}
	fix := "check that it is a readable file"
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		fix = "check the path"
	case errors.Is(err, fs.ErrPermission):
		fix = readableFix
	case errors.Is(err, syscall.ELOOP):
		fix = "check where its symbolic links point"
	}
	return dag.ErrorList{{File: file, Line: 1, Col: 1, Msg: "cannot read the workflow file: " + systemReason(err) + "; " + fix}}
}

// systemReason is what the system said was wrong with a path, without
// the operation and the path an *fs.PathError names: the line validate
// prints starts with the path already.
func systemReason(err error) string {
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return pathErr.Err.Error()
	}
	return err.Error()
}

// fileCheck is what validate found in one file: its workflow, or its errors.
type fileCheck struct {
	file     string
	workflow *dag.Workflow
	err      error
}

// checkFiles parses each file, then checks the calls between workflows.
// A file named on its own may call the workflows of its folder, as it
// would once loaded from there, or of the --workflows folder, which it may
// be written to join: with alone, those folders' other workflows are
// parsed as well, to check the calls against, but their own errors are not
// reported. Files listed from a folder resolve their calls in it alone,
// as the engine loads a folder.
func (c *cli) checkFiles(files []string, alone bool, opts *dag.ParseOptions) []fileCheck {
	out := make([]fileCheck, len(files))
	var (
		valid  []*dag.Workflow
		named  = map[string]bool{}
		broken = map[string]string{}
	)
	// partial are what could be read of the files with errors: their
	// calls are checked too, so that every error of a file shows at once.
	var partial []*dag.Workflow
	note := func(path string, w *dag.Workflow, err error) {
		switch {
		case err == nil:
			if !named[w.Name] {
				named[w.Name] = true
				valid = append(valid, w)
			}
		default:
			name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".yaml"), ".yml")
			if _, ok := broken[name]; !ok {
				broken[name] = path
			}
			if w != nil {
				partial = append(partial, w)
			}
		}
	}
	firstFile := map[string]string{} // by workflow name, the first file checked that declares it
	for i, file := range files {
		if e := notLoaded(file); e != nil {
			// Not even a broken workflow: the engine never reads it.
			out[i] = fileCheck{file: file, err: dag.ErrorList{e}}
			continue
		}
		w, err := dag.ParseFilePartial(file, opts)
		if err == nil {
			if first, dup := firstFile[w.Name]; dup {
				// As the engine's loader refuses it: which one would run?
				w, err = nil, dag.ErrorList{dag.DefinedTwice(w, first)}
			} else {
				firstFile[w.Name] = file
			}
		}
		out[i] = fileCheck{file: file, err: err}
		if err == nil {
			out[i].workflow = w
		}
		note(file, w, err)
	}
	if alone {
		// A workflow step runs a workflow of its own file's folder; the
		// --workflows folder comes after, for a file being written
		// elsewhere before it joins the others.
		var others []string
		dirs := folders(files)
		if dir := filepath.Clean(c.workflowsDir); !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
		for _, dir := range dirs {
			listed, _ := workflowFiles(dir)
			others = append(others, listed...)
		}
		for _, file := range others {
			if slices.Contains(files, file) {
				continue
			}
			w, err := dag.ParseFilePartial(file, opts)
			if w != nil && named[w.Name] {
				continue // a file given by name stands for its workflow
			}
			note(file, w, err)
		}
	}
	calls := dag.CheckCalls(append(valid, partial...), broken)
	for i := range out {
		f := &out[i]
		var mine dag.ErrorList
		if f.err != nil {
			if !errors.As(f.err, &mine) {
				continue // the file could not be read
			}
			mine = slices.Clone(mine)
		}
		for _, e := range calls {
			if e.File == f.file {
				mine = append(mine, e)
			}
		}
		if len(mine) > 0 {
			mine.Sort()
			f.err = mine
		}
	}
	return out
}

// notLoaded is the error of a file given by name that the engine would
// never load from a workflows folder (see dag.WorkflowFile), so that an ok
// from validate always means the workflow loads; nil for a workflow file.
func notLoaded(file string) *dag.Error {
	base := filepath.Base(file)
	var msg string
	switch {
	case dag.WorkflowFile(base):
		return nil
	case strings.HasPrefix(base, "."):
		msg = "dagrun skips files whose name starts with a dot, as editor leftovers; rename it without the dot"
	default:
		msg = "not a workflow file: dagrun loads only files whose name ends in .yaml or .yml; rename it to end in .yaml"
	}
	return &dag.Error{File: file, Line: 1, Col: 1, Msg: msg}
}

// folders returns the folders of files, each once, in order.
func folders(files []string) []string {
	var out []string
	for _, f := range files {
		if dir := filepath.Clean(filepath.Dir(f)); !slices.Contains(out, dir) {
			out = append(out, dir)
		}
	}
	return out
}

// workflowFiles lists the workflow files of a workflows folder (see
// dag.WorkflowFile): the error is the system's, or errNoWorkflowFiles.
func workflowFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && dag.WorkflowFile(e.Name()) {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, errNoWorkflowFiles
	}
	sort.Strings(files)
	return files, nil
}

func (c *cli) graphCommand() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "graph WORKFLOW",
		Short: "Print a workflow's DAG as Mermaid or Graphviz DOT",
		Args:  exactArgs(1, "graph WORKFLOW [--format mermaid|dot]"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "mermaid" && format != "dot" {
				return usageError(fmt.Errorf("invalid --format %q: use mermaid or dot", format))
			}
			w, err := c.findWorkflow(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := w.Mermaid()
			if format == "dot" {
				out = w.DOT()
			}
			_, err = fmt.Fprint(c.io.Stdout, out)
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "mermaid", "mermaid or dot")
	return cmd
}

// findWorkflow parses one workflow of the folder by name. The name is
// matched against the folder's entries, never joined into a path, so a
// name such as ../../x reads nothing outside the folder.
func (c *cli) findWorkflow(ctx context.Context, name string) (*dag.Workflow, error) {
	opts := &dag.ParseOptions{HandlerExists: c.registry.Has, HandlerNames: c.registry.Names}
	entries, _ := os.ReadDir(c.workflowsDir)
	for _, ext := range []string{".yaml", ".yml"} {
		for _, e := range entries {
			if e.IsDir() || e.Name() != name+ext {
				continue
			}
			path := filepath.Join(c.workflowsDir, e.Name())
			w, err := whileRunning(ctx, func() (*dag.Workflow, error) { return dag.ParseFile(path, opts) })
			if hasExitCode(err) {
				return nil, err
			}
			if err == nil && callsWorkflows(w) {
				// Its calls are checked against the rest of the folder, as
				// every load of the folder does.
				checked, waitErr := whileRunning(ctx, func() ([]fileCheck, error) { return c.checkFiles([]string{path}, true, opts), nil })
				if waitErr != nil {
					return nil, waitErr
				}
				err = checked[0].err
			}
			if err != nil {
				return nil, usageError(invalidWorkflowError(name, path, err))
			}
			return w, nil
		}
	}
	workflows, err := c.loadWorkflows(ctx)
	if hasExitCode(err) {
		return nil, err
	}
	names := make([]string, len(workflows))
	for i, w := range workflows {
		names[i] = w.Name
	}
	if len(names) == 0 {
		if _, err := os.Stat(c.workflowsDir); errors.Is(err, os.ErrNotExist) {
			return nil, usageError(fmt.Errorf("unknown workflow %s: the workflows folder %s does not exist (name another with --workflows or DAGRUN_WORKFLOWS)", view.QuoteShort(name), c.workflowsDir))
		}
		return nil, usageError(fmt.Errorf("unknown workflow %s: no valid workflows in %s (check them with: dagrun validate)", view.QuoteShort(name), c.workflowsDir))
	}
	return nil, usageError(fmt.Errorf("unknown workflow %s (available: %s)", view.QuoteShort(name), strings.Join(names, ", ")))
}

// callsWorkflows reports whether a workflow has workflow steps.
func callsWorkflows(w *dag.Workflow) bool {
	for _, s := range w.Steps {
		if s.Workflow != "" {
			return true
		}
	}
	return false
}

// invalidWorkflowError sums up a workflow file's validation errors on one
// line: the first error, how many more, and the command that lists them.
func invalidWorkflowError(name, path string, err error) error {
	return fmt.Errorf("workflow %s is invalid: %s; list every error with: dagrun validate %s", name, dag.Summary(err), path)
}
