package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/cmd/dagrun/dagruntest"
	"github.com/dagrun/dagrun/handlers"
)

// TestCustomBinaryRunsItsOwnHandler drives the same entry point main uses,
// with this binary's own handler registered.
func TestCustomBinaryRunsItsOwnHandler(t *testing.T) {
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	registry.Register("greet.hello", handlers.Typed(hello))
	var stdout, stderr bytes.Buffer
	code := app.Run(context.Background(), []string{
		"--db", filepath.Join(t.TempDir(), "custom.db"), "--workflows", "workflows",
		"start", "greet", "--input", `{"name": "Ada"}`,
	}, &app.IO{Stdout: &stdout, Stderr: &stderr}, registry)
	require.Equal(t, 0, code, stderr.String())
	var out map[string]string
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &out))
	require.Equal(t, map[string]string{"greeting": "Hello, Ada!", "loud": "HELLO, ADA!"}, out)
}

// TestCustomBinaryTestsItsWorkflows runs the workflow tests of this
// binary's folder through its own command line (dagrun test), so that its
// real: true steps run its own handler, and through the Go API.
func TestCustomBinaryTestsItsWorkflows(t *testing.T) {
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	registry.Register("greet.hello", handlers.Typed(hello))
	var stdout, stderr bytes.Buffer
	code := app.Run(context.Background(), []string{"--workflows", "workflows", "test"},
		&app.IO{Stdout: &stdout, Stderr: &stderr}, registry)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Contains(t, stdout.String(), "ok   greet/greets with the binary's own handler")
	require.Contains(t, stdout.String(), "PASS: 3 cases")

	dagruntest.Run(t, registry, "workflows")
}
