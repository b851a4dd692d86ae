package dag

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ParseOptions tunes Parse. The zero value (or nil) checks everything but
// handler registration.
type ParseOptions struct {
	// HandlerExists, when non-nil, makes unregistered handler names errors
	// ("step \"x\": handler \"foo\" is not registered (registered: a, b, c)").
	HandlerExists func(name string) bool
	// HandlerNames, when non-nil, lists the registered handler names; it is
	// only used to make the unregistered-handler message helpful (the list and
	// a did-you-mean). Without it the message names no alternatives.
	HandlerNames func() []string
	// Stored, for a definition snapshot an instance already runs under,
	// skips the bounds on sizes and numbers (MaxSteps, MaxFileBytes,
	// MaxAttemptsLimit, MinDuration, MaxDuration): a snapshot written by an
	// earlier version must still plan, and its steps' retry and timeout
	// were stored with the instance.
	Stored bool
}

// Parse parses and validates one workflow. filename is used in error positions
// and for the check that the workflow name equals the file name (skipped when
// filename == ""). On any error it returns nil and an ErrorList holding every
// error found, sorted by line and column.
func Parse(filename string, src []byte, opts *ParseOptions) (*Workflow, error) {
	w, err := parsePartial(filename, src, opts)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// parsePartial is Parse returning, besides the errors of a file it
// refuses, what it built of it (nil when not even a named workflow): a
// partial workflow, marked so, whose calls CheckCalls still checks.
func parsePartial(filename string, src []byte, opts *ParseOptions) (*Workflow, error) {
	if opts == nil {
		opts = &ParseOptions{}
	}
	p := &parser{c: &collector{file: filename}, src: src, opts: opts, filename: filename}
	if len(src) > MaxFileBytes && !opts.Stored {
		p.c.atPos(1, 1, "the file is larger than the limit of %s for a workflow file: split it into workflows that start one another", fmtBytes(MaxFileBytes))
		return nil, p.c.errs
	}
	w := p.parse()
	if w != nil {
		w.file = filename
	}
	if len(p.c.errs) > 0 {
		sortErrors(p.c.errs)
		if w != nil && isName(w.Name) {
			w.partial = true
			return w, p.c.errs
		}
		return nil, p.c.errs
	}
	return w, nil
}

// ParseFile reads and parses one workflow file. A file that cannot be read
// gives the os error (so errors.Is(err, fs.ErrNotExist) works), not an ErrorList.
func ParseFile(path string, opts *ParseOptions) (*Workflow, error) {
	w, err := ParseFilePartial(path, opts)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// ParseFilePartial is ParseFile returning, with the errors of a file it
// refuses, what it read of its workflow when it could read a name: a
// workflow that must never run, given to CheckCalls with the others so
// that a bad call in a file with other errors is reported too.
func ParseFilePartial(path string, opts *ParseOptions) (*Workflow, error) {
	src, err := readWorkflowFile(path)
	if err != nil {
		return nil, fmt.Errorf("read workflow: %w", err)
	}
	return parsePartial(path, src, opts)
}

// readWorkflowFile reads a file, or MaxFileBytes+1 of it: enough for Parse
// to refuse it without holding a huge file in memory. Only a regular file
// is read: opening a named pipe or a device waits for a writer that may
// never come, and every command loads the folder.
func readWorkflowFile(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is a %s, not a regular file: move it out of the workflows folder", filepath.Base(path), fileKind(info.Mode()))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
}

// fileKind names what a non-regular file is, for an error.
func fileKind(mode fs.FileMode) string {
	switch {
	case mode.IsDir():
		return "folder"
	case mode&fs.ModeNamedPipe != 0:
		return "named pipe"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeDevice != 0:
		return "device"
	default:
		return "special file"
	}
}

// LoadDir parses every *.yaml / *.yml file in dir (non-recursive; names
// starting with "." are skipped as editor leftovers). It returns the valid
// workflows sorted by name and an ErrorList of all errors of all files (nil if
// none): one broken file does not hide the others. Two files declaring the same
// workflow name are an error, and so are the calls between workflows that
// CheckCalls refuses: a workflow with such a call is left out too, so that
// no instance starts one that could never finish. Only a failure to list
// dir is returned as a plain error.
func LoadDir(dir string, opts *ParseOptions) ([]*Workflow, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read workflows folder: %w", err)
	}
	var (
		wfs    []*Workflow
		errs   ErrorList
		byName = map[string]string{}
		broken = map[string]string{} // workflows whose file has errors, by the name the file gives
		// partial are what could be read of those files: their calls are
		// checked too, so that every error of a file shows at once.
		partial []*Workflow
	)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !WorkflowFile(name) {
			continue
		}
		ext := filepath.Ext(name)
		path := filepath.Join(dir, name)
		src, err := readWorkflowFile(path)
		if err != nil {
			errs = append(errs, &Error{File: path, Line: 1, Col: 1, Msg: fmt.Sprintf("cannot read the file: %v", err)})
			continue
		}
		w, err := parsePartial(path, src, opts)
		if err != nil {
			broken[strings.TrimSuffix(name, ext)] = path
			var l ErrorList
			if errors.As(err, &l) {
				errs = append(errs, l...)
			} else {
				errs = append(errs, &Error{File: path, Msg: err.Error()})
			}
			if w != nil {
				partial = append(partial, w)
			}
			continue
		}
		if first, dup := byName[w.Name]; dup {
			errs = append(errs, DefinedTwice(w, first))
			continue
		}
		byName[w.Name] = path
		wfs = append(wfs, w)
	}
	callErrs, bad := checkCalls(append(slices.Clip(wfs), partial...), broken)
	errs = append(errs, callErrs...)
	wfs = slices.DeleteFunc(wfs, func(w *Workflow) bool { return bad[w.Name] })
	sort.Slice(wfs, func(i, j int) bool { return wfs[i].Name < wfs[j].Name })
	if len(errs) > 0 {
		sortErrors(errs)
		return wfs, errs
	}
	return wfs, nil
}

// DefinedTwice is the error of a workflow whose name an earlier file of
// its folder (first) already declares, at the name in w's file.
func DefinedTwice(w *Workflow, first string) *Error {
	return &Error{File: w.file, Line: w.nameLine, Col: w.nameCol,
		Msg: fmt.Sprintf("workflow %q is already defined in %s: keep only one of the two files", w.Name, first)}
}

// WorkflowFile reports whether a folder entry named name is a workflow
// file: .yaml or .yml, and not hidden (editors leave dot-files behind).
func WorkflowFile(name string) bool {
	ext := filepath.Ext(name)
	return !strings.HasPrefix(name, ".") && (ext == ".yaml" || ext == ".yml")
}

// The raw* types mirror the YAML structure: each field is the node as written,
// nil when the key is absent. validate.go turns them into the model, so type
// errors are reported at the node that holds the wrong value.
type rawWorkflow struct {
	node                                              *yaml.Node
	misspelt                                          map[string]bool // keys an unknown key was suggested to be
	Name, Description, Input, Defaults, Steps, Output *yaml.Node
	Schedule                                          *yaml.Node
	Timeout, OnFailure, Concurrency                   *yaml.Node
}

type rawDefaults struct {
	Retry, Timeout, Queue *yaml.Node
}

type rawStep struct {
	node                                                                          *yaml.Node
	misspelt                                                                      map[string]bool
	Name, Handler, DependsOn, Input, When, Retry, Timeout, Queue, ContinueOnError *yaml.Node
	ForEach, Concurrency, Wait, Workflow                                          *yaml.Node
}

type rawWait struct {
	Signal, Timeout, Schema *yaml.Node
}

func (r *rawWait) fields() []field {
	return []field{{"signal", &r.Signal}, {"timeout", &r.Timeout}, {"schema", &r.Schema}}
}

type rawRetry struct {
	MaxAttempts, Backoff, MaxBackoff *yaml.Node
}

// field binds a YAML key to the raw field receiving its node.
type field struct {
	key string
	dst **yaml.Node
}

func (r *rawWorkflow) fields() []field {
	return []field{{"name", &r.Name}, {"description", &r.Description}, {"input", &r.Input},
		{"defaults", &r.Defaults}, {"steps", &r.Steps}, {"output", &r.Output}, {"schedule", &r.Schedule},
		{"timeout", &r.Timeout}, {"onFailure", &r.OnFailure}, {"concurrency", &r.Concurrency}}
}

func (r *rawDefaults) fields() []field {
	return []field{{"retry", &r.Retry}, {"timeout", &r.Timeout}, {"queue", &r.Queue}}
}

func (r *rawStep) fields() []field {
	return []field{{"name", &r.Name}, {"handler", &r.Handler}, {"dependsOn", &r.DependsOn},
		{"input", &r.Input}, {"when", &r.When}, {"retry", &r.Retry}, {"timeout", &r.Timeout},
		{"queue", &r.Queue}, {"continueOnError", &r.ContinueOnError}, {"forEach", &r.ForEach},
		{"concurrency", &r.Concurrency}, {"wait", &r.Wait}, {"workflow", &r.Workflow}}
}

func (r *rawRetry) fields() []field {
	return []field{{"maxAttempts", &r.MaxAttempts}, {"backoff", &r.Backoff}, {"maxBackoff", &r.MaxBackoff}}
}

// Keys lists the keys a workflow file may use in each of its mappings.
type Keys struct {
	Workflow, Defaults, Step, Retry, Schedule, Wait []string
	// Concurrency is the keys of a concurrency mapping (workflow or step).
	Concurrency []string
}

// AcceptedKeys returns the keys the parser accepts, in the order its
// messages list them, so that documentation can be checked against the
// parser rather than against a copy of its list.
func AcceptedKeys() Keys {
	return Keys{
		Workflow: keysOf((&rawWorkflow{}).fields()),
		Defaults: keysOf((&rawDefaults{}).fields()),
		Step:     keysOf((&rawStep{}).fields()),
		Retry:    keysOf((&rawRetry{}).fields()),
		Schedule: keysOf((&rawSchedule{}).fields()),
		Wait:     keysOf((&rawWait{}).fields()),

		Concurrency: keysOf((&rawConcurrency{}).fields()),
	}
}

func keysOf(fields []field) []string {
	keys := make([]string, len(fields))
	for i, f := range fields {
		keys[i] = f.key
	}
	return keys
}

// parser holds the state of one Parse call.
type parser struct {
	c          *collector
	src        []byte
	opts       *ParseOptions
	filename   string
	lineStarts []int // byte offset of each line of src, see sourceLine
	budget     int   // nodes left to visit; bounds alias expansion ("billion laughs")
	overBudget bool  // the budget error was reported
	// defaultBackoffReported: a step inherited from defaults a backoff
	// longer than its maxBackoff, and the error was reported there.
	defaultBackoffReported bool
}

// maxNodes bounds how many YAML nodes one file may expand to (aliases
// included), so a hostile file cannot make validation take forever.
const maxNodes = 200_000

// maxDepth bounds nesting, which also stops self-referencing aliases.
const maxDepth = 200

func (p *parser) parse() (w *Workflow) {
	doc, ok := p.decode()
	if !ok {
		return nil
	}
	p.budget = maxNodes
	root := resolve(doc)
	if root == nil || root.Kind == 0 || (root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null") {
		p.c.at(nil, `the file is empty: a workflow needs at least "name" and "steps"`)
		return nil
	}
	raw := &rawWorkflow{node: root}
	if root.Kind != yaml.MappingNode {
		p.c.at(root, "a workflow must be a YAML mapping with keys such as name and steps, got %s", describe(root))
		return nil
	}
	raw.misspelt = p.extensibleMapping(root, "at the top level", raw.fields())
	return p.build(raw)
}

// decode reads exactly one YAML document into a node tree. yaml.v3 has
// panicked on hostile input in the past, so a panic becomes a YAML error.
func (p *parser) decode() (doc *yaml.Node, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			p.c.at(nil, "invalid YAML: %v", r)
			doc, ok = nil, false
		}
	}()
	dec := yaml.NewDecoder(strings.NewReader(string(p.src)))
	doc = &yaml.Node{}
	if err := dec.Decode(doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &yaml.Node{}, true
		}
		p.c.yamlError(p.src, err)
		return nil, false
	}
	var second yaml.Node
	switch err := dec.Decode(&second); {
	case errors.Is(err, io.EOF):
	case err != nil:
		p.c.yamlError(p.src, err)
		return nil, false
	default:
		p.c.at(&second, "a workflow file holds one YAML document, found a second one (after ---): move it to its own file")
		return nil, false
	}
	return doc, true
}

// resolve follows document wrappers and aliases to the node holding the value.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && i < maxDepth; i++ {
		switch {
		case n.Kind == yaml.DocumentNode && len(n.Content) > 0:
			n = n.Content[0]
		case n.Kind == yaml.DocumentNode:
			return nil
		case n.Kind == yaml.AliasNode:
			n = n.Alias
		default:
			return n
		}
	}
	return n
}

// spend charges cost nodes to the budget, and reports once (at n) when the
// budget or the nesting limit is exceeded.
func (p *parser) spend(n *yaml.Node, cost, depth int) bool {
	p.budget -= cost
	if p.budget >= 0 && depth <= maxDepth {
		return true
	}
	if !p.overBudget {
		p.overBudget = true
		p.c.at(n, "value is nested too deeply or too large (at most %d levels and %d values, aliases and merge keys included)", maxDepth, maxNodes)
	}
	return false
}

// pair is one key/value of a mapping, aliases resolved.
type pair struct {
	key, value *yaml.Node
}

// pairs lists the entries of a mapping node, expanding YAML merge keys
// (<<: *anchor). Keys written explicitly win over merged ones, as the YAML
// merge spec says.
func (p *parser) pairs(m *yaml.Node, depth int) []pair {
	var out, merged []pair
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := resolve(m.Content[i]), resolve(m.Content[i+1])
		if k == nil || v == nil {
			continue
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			sources := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				sources = nil
				for _, s := range v.Content {
					sources = append(sources, resolve(s))
				}
			}
			for _, s := range sources {
				if s == nil || s.Kind != yaml.MappingNode {
					p.c.at(k, "merge key << must refer to a mapping (<<: *anchor), got %s", describe(s))
					continue
				}
				// Merges expand aliases too: charge them to the same budget.
				if !p.spend(k, 1+len(s.Content)/2, depth) {
					return out
				}
				merged = append(merged, p.pairs(s, depth+1)...)
			}
			continue
		}
		out = append(out, pair{k, v})
	}
	if len(merged) == 0 {
		return out
	}
	seen := map[string]bool{}
	for _, kv := range out {
		seen[kv.key.Value] = true
	}
	for _, kv := range merged {
		if !seen[kv.key.Value] {
			seen[kv.key.Value] = true
			out = append(out, kv)
		}
	}
	return out
}

// mapping decodes a mapping of known keys into raw fields, reporting unknown
// keys (with a did-you-mean), duplicate keys and non-string keys. where
// completes the message: "unknown key "x" <where>". It returns the known keys
// it suggested, so that a "missing key" error for a key the user merely
// misspelt is not reported on top of the did-you-mean.
func (p *parser) mapping(m *yaml.Node, where string, fields []field) (suggested map[string]bool) {
	return p.mappingOf(m, where, fields, false)
}

// extensibleMapping is mapping for a workflow's top level and its steps,
// where a key starting with "x-" is the user's own and is ignored: the
// place for a block that anchors define and merge keys reuse
// (x-common: &common), as Docker Compose's extension fields are.
func (p *parser) extensibleMapping(m *yaml.Node, where string, fields []field) (suggested map[string]bool) {
	return p.mappingOf(m, where, fields, true)
}

func (p *parser) mappingOf(m *yaml.Node, where string, fields []field, extensible bool) (suggested map[string]bool) {
	suggested = map[string]bool{}
	keys := keysOf(fields)
	seen := map[string]*yaml.Node{}
	for _, kv := range p.pairs(m, 0) {
		k := kv.key
		if k.Kind != yaml.ScalarNode {
			p.c.at(k, "keys must be plain words %s, got %s", where, describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.c.at(k, "key %q is set twice %s (first at line %d): keep one", k.Value, where, first.Line)
			continue
		}
		seen[k.Value] = k
		found := false
		for _, f := range fields {
			if f.key == k.Value {
				*f.dst = kv.value
				found = true
				break
			}
		}
		if !found && !(extensible && strings.HasPrefix(k.Value, "x-")) {
			if s := suggest(k.Value, keys); s != "" {
				p.c.at(k, "unknown key %q %s (did you mean %q?)", k.Value, where, s)
				suggested[s] = true
			} else {
				p.c.at(k, "unknown key %q %s (valid keys: %s)", k.Value, where, strings.Join(keys, ", "))
			}
		}
	}
	return suggested
}

// describe names the kind of a node for "got ..." messages.
func describe(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!bool":
			return "true/false (" + n.Value + ")"
		case "!!int", "!!float":
			return "a number (" + n.Value + ")"
		default:
			return "the text " + quoteText(n.Value)
		}
	}
	return "an unexpected YAML value"
}

// maxQuotedText is how much of a text value a message quotes: enough to
// recognise it, not so much that one line of output holds a whole file.
const maxQuotedText = 64

// quoteText quotes s for a message, its first maxQuotedText characters and
// how many more there are when it is longer.
func quoteText(s string) string {
	r := []rune(s)
	if len(r) <= maxQuotedText {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s... (%d characters)", strconv.Quote(string(r[:maxQuotedText])), len(r))
}

// hashSource is the content hash the engine keys definition snapshots by.
func hashSource(src []byte) string {
	sum := sha256.Sum256(src)
	return hex.EncodeToString(sum[:])
}
