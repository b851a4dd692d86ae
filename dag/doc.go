// Package dag holds workflow definitions: it parses a workflow YAML file (schema
// v1) with the position of every node, validates it, compiles its ${{ }}
// expressions and its input JSON Schema once, and offers the graph operations
// the engine and the CLI need (topological order, ancestors, Mermaid and DOT).
//
// It imports no storage and no handlers: whether a handler name is registered
// is asked through ParseOptions.HandlerExists, so the registry stays the
// engine's business and this package stays a leaf. Expressions are compiled
// here and evaluated by the engine through Template.Eval and Expr.Bool.
//
// # Evaluation limits
//
// Expressions run inside the store's write transaction, so each evaluation
// is bounded (EvalMemoryLimit, EvalStepLimit): the compiled program is
// patched to charge a meter for loop steps, compared or concatenated
// operands and builtin arguments and results, and repeat, join and replace
// check the size of their result before building it. The meter counts, it
// does not time: the same evaluation always stops at the same place.
// Validation is linear in the size of the workflow (MaxSteps, MaxFileBytes).
//
// # Validation
//
// Parse reports every error of a file, not just the first, each as
// FILE:LINE:COL: message (see Error and ErrorList), one line each, written for
// the person who has to fix the file. Workflow steps name workflows of other
// files, so their calls are checked once the folder is parsed (CheckCalls,
// which LoadDir runs): unknown names, call cycles, and required child input
// that a literal input lacks.
//
// # Decisions where the design is silent
//
//   - retry.backoff longer than retry.maxBackoff is an error (after defaults
//     are applied): the cap would silently make every delay maxBackoff.
//     Temporal rejects the same combination.
//   - dependsOn also accepts a single name (dependsOn: validate).
//   - when accepts "${{ expr }}" and the bare "expr"; Expr.Bool treats any
//     non-bool result, nil included, as an error rather than as false.
//   - Member access is nil-safe everywhere (a.b.c is a?.b?.c): the output of
//     a skipped step, or an absent input field, reads as nil.
//   - The input schema is JSON Schema 2020-12 unless it says otherwise with
//     $schema; format is asserted (format: email rejects non-emails); $ref may
//     only point inside the schema, never to a file or URL.
//   - YAML anchors, aliases and merge keys (<<: *anchor) work, within limits
//     that stop alias bombs; a file holds exactly one YAML document.
//   - retry.maxAttempts is 1 to MaxAttemptsLimit and every duration is
//     MinDuration to MaxDuration, so that each value is stored alike by
//     both backends instead of being cut to 32 bits or to 0 µs.
//   - YAML timestamps (2024-01-02) in templates stay text; .inf and .nan are
//     errors, as JSON cannot hold them.
package dag
