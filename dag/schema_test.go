package dag

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSchemaDrafts checks each draft's schemas against that draft's own
// metaschema: the library compiles a draft's metaschema the first time a
// schema of it is compiled (dag/internal/jsonschema), so every case runs
// in several goroutines at once, which the race detector watches.
func TestSchemaDrafts(t *testing.T) {
	const (
		draft4    = `"$schema": "http://json-schema.org/draft-04/schema#"`
		draft6    = `"$schema": "http://json-schema.org/draft-06/schema#"`
		draft7    = `"$schema": "http://json-schema.org/draft-07/schema#"`
		draft2019 = `"$schema": "https://json-schema.org/draft/2019-09/schema"`
		draft2020 = `"$schema": "https://json-schema.org/draft/2020-12/schema"`
	)
	tests := []struct {
		name   string
		schema string
		// compileError, when set, is part of the error compiling gives;
		// otherwise valid and invalid are instances the schema accepts
		// and refuses.
		compileError   string
		valid, invalid string
	}{
		// exclusiveMinimum was a boolean beside minimum until draft-06
		// made it a number of its own.
		{name: "draft-04 boolean exclusiveMinimum", schema: `{` + draft4 + `, "minimum": 1, "exclusiveMinimum": true}`, valid: `2`, invalid: `1`},
		{name: "draft-06 numeric exclusiveMinimum", schema: `{` + draft6 + `, "exclusiveMinimum": 1}`, valid: `2`, invalid: `1`},
		{name: "draft-07 refuses a boolean exclusiveMinimum", schema: `{` + draft7 + `, "minimum": 1, "exclusiveMinimum": true}`, compileError: "exclusiveMinimum"},
		// items as an array of schemas (a tuple) ended with 2020-12,
		// dagrun's default draft.
		{name: "draft-07 tuple items", schema: `{` + draft7 + `, "items": [{"type": "string"}]}`, valid: `["a"]`, invalid: `[1]`},
		{name: "2019-09 tuple items", schema: `{` + draft2019 + `, "items": [{"type": "string"}]}`, valid: `["a", 1]`, invalid: `[1]`},
		{name: "2020-12 refuses tuple items", schema: `{` + draft2020 + `, "items": [{"type": "string"}]}`, compileError: "items"},
		{name: "default draft refuses tuple items", schema: `{"items": [{"type": "string"}]}`, compileError: "items"},
		{name: "default draft prefixItems", schema: `{"prefixItems": [{"type": "string"}]}`, valid: `["a", 1]`, invalid: `[1]`},
		{name: "format asserted", schema: `{` + draft2019 + `, "format": "email"}`, valid: `"ada@example.com"`, invalid: `"nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const goroutines = 4
			errs := make([]error, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() { errs[g] = checkSchema(tt.schema, tt.compileError, tt.valid, tt.invalid) })
			}
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
		})
	}
}

// checkSchema compiles schema and checks it as a TestSchemaDrafts case
// says.
func checkSchema(schema, compileError, valid, invalid string) error {
	sch, err := compileSchema([]byte(schema))
	if compileError != "" {
		if err == nil {
			return fmt.Errorf("compiled %s, want an error about %s", schema, compileError)
		}
		if !strings.Contains(err.Error(), compileError) {
			return fmt.Errorf("compiling %s: %v, want an error about %s", schema, err, compileError)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("compiling %s: %v", schema, err)
	}
	if err := validate(sch, nil, "input", ErrInvalidInput, rawJSON(valid)); err != nil {
		return fmt.Errorf("%s refused %s: %v", schema, valid, err)
	}
	if err := validate(sch, nil, "input", ErrInvalidInput, rawJSON(invalid)); err == nil {
		return fmt.Errorf("%s accepted %s", schema, invalid)
	}
	return nil
}

type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// TestSchemaLibraryInitCompilesNothing runs this test binary again with
// GODEBUG=inittrace=1, which prints what each package's init allocated,
// and fails if the JSON Schema library's allocates like upstream's, which
// compiles every draft's metaschema at start (1.7 MB; see
// dag/internal/jsonschema). Every dagrun command, and every worker of a
// fleet, links it.
func TestSchemaLibraryInitCompilesNothing(t *testing.T) {
	if os.Getenv("DAG_TEST_INITTRACE") != "" {
		return // the child: its init has run and been traced
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSchemaLibraryInitCompilesNothing$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1", "DAG_TEST_INITTRACE=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	m := regexp.MustCompile(`(?m)^init github\.com/santhosh-tekuri/jsonschema/v6 @.* ([0-9]+) bytes,`).FindSubmatch(out)
	require.NotNil(t, m, "no inittrace line for the JSON Schema library in:\n%s", out)
	allocated, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	require.Less(t, allocated, 64<<10, "the JSON Schema library's init allocated %d bytes: is the replace of dag/internal/jsonschema in go.mod gone?", allocated)
}
