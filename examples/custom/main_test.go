package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
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
