package dag

import (
	"fmt"
	"strings"
	"testing"
)

// chainSource is a workflow of n steps, each depending on the one before
// and reading its output.
func chainSource(n int) []byte {
	var b strings.Builder
	b.WriteString("name: chain\nsteps:\n  - name: s0\n    handler: echo\n")
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "  - name: s%d\n    handler: echo\n    dependsOn: [s%d]\n    input: ${{ steps.s%d.output }}\n", i, i-1, i-1)
	}
	return []byte(b.String())
}

// independentSource is a workflow of n steps without dependencies.
func independentSource(n int) []byte {
	var b strings.Builder
	b.WriteString("name: wide\nsteps:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: s%d\n    handler: echo\n    input: ${{ input.x }}\n", i)
	}
	return []byte(b.String())
}

func benchmarkParse(b *testing.B, src []byte) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("", src, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidateChain10000(b *testing.B) { benchmarkParse(b, chainSource(10_000)) }

func BenchmarkValidateIndependent10000(b *testing.B) { benchmarkParse(b, independentSource(10_000)) }
