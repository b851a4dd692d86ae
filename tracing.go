package dagrun

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/dagrun/dagrun/storage"
)

// A trace of an instance is one span for the instance, from its creation to
// its finish, and one child span per step attempt. Many processes take
// part, so the instance span's IDs are chosen when it starts and stored
// with it (storage.CreateParams.TraceParent): every attempt span, whichever
// worker runs it, names it as its parent, and whichever process finishes
// the instance emits it with those IDs and its creation time. A
// TracerProvider picks span IDs itself, so emitting one with a chosen ID
// needs its ID generator to be TraceIDGenerator.

// tracerName names the instrumentation scope of dagrun's spans.
const tracerName = "github.com/dagrun/dagrun"

// Span attributes. OpenTelemetry's semantic conventions have none for
// workflow engines yet; error.type is theirs.
const (
	attrWorkflow = attribute.Key("workflow.name")
	attrInstance = attribute.Key("workflow.instance.id")
	attrStep     = attribute.Key("workflow.step")
	attrAttempt  = attribute.Key("workflow.attempt")
	attrItem     = attribute.Key("workflow.step.item")
	attrOutcome  = attribute.Key("workflow.outcome")
	attrStatus   = attribute.Key("workflow.status")
	attrRetried  = attribute.Key("workflow.retried")
)

// traceContext is the W3C Trace Context propagator: traceparent in and out.
var traceContext propagation.TraceContext

// presetIDsKey carries, in the context of a span start, the IDs
// TraceIDGenerator gives the span.
type presetIDsKey struct{}

type presetIDs struct {
	traceID trace.TraceID
	spanID  trace.SpanID
}

// TraceIDGenerator returns the ID generator a TracerProvider given to
// Config.TracerProvider should use (sdktrace.WithIDGenerator): random IDs,
// except for an instance's span, whose IDs were chosen when it started.
// Without it, the instance spans carry other IDs than their attempts'
// parents (the engine logs a warning once).
func TraceIDGenerator() *IDGenerator { return &IDGenerator{} }

// IDGenerator implements the OpenTelemetry SDK's IDGenerator; see
// TraceIDGenerator.
type IDGenerator struct{}

// NewIDs returns the preset IDs of an instance span, random ones otherwise.
func (*IDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if ids, ok := ctx.Value(presetIDsKey{}).(presetIDs); ok {
		return ids.traceID, ids.spanID
	}
	return randomTraceID(), randomSpanID()
}

// NewSpanID returns the preset span ID of an instance span, a random one
// otherwise.
func (*IDGenerator) NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID {
	if ids, ok := ctx.Value(presetIDsKey{}).(presetIDs); ok && ids.traceID == traceID {
		return ids.spanID
	}
	return randomSpanID()
}

func randomTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:8], rand.Uint64())
		binary.BigEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.BigEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}

// tracing is the engine's tracer; nil when tracing is off, which costs the
// hot paths nothing.
type tracing struct {
	tracer trace.Tracer
	logger *slog.Logger
	// warnIDs warns once that the provider ignores the preset IDs.
	warnIDs sync.Once
}

func newTracing(tp trace.TracerProvider, logger *slog.Logger) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(tracerName), logger: logger}
}

// instanceTrace chooses the IDs of a new instance's span: in the trace of
// the span in ctx (a caller's traceparent) as its child, or of a new trace.
func instanceTrace(ctx context.Context) (traceParent, caller string) {
	parent := trace.SpanContextFromContext(ctx)
	traceID, flags := randomTraceID(), trace.FlagsSampled
	if parent.IsValid() {
		traceID, flags = parent.TraceID(), parent.TraceFlags()
		caller = parent.SpanID().String()
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: randomSpanID(), TraceFlags: flags})
	return formatTraceParent(sc), caller
}

// childTrace chooses the IDs of a child instance's span: in its parent
// instance's trace (traceParent) as the child of the parent's span, or of
// a new trace when the parent has none.
func childTrace(traceParent string) (childParent, caller string) {
	parent := parseTraceParent(traceParent)
	if !parent.IsValid() {
		return instanceTrace(context.Background())
	}
	return instanceTrace(trace.ContextWithRemoteSpanContext(context.Background(), parent))
}

func formatTraceParent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// parseTraceParent reads a stored or given W3C traceparent; an invalid
// one gives the invalid SpanContext.
func parseTraceParent(s string) trace.SpanContext {
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": s})
	return trace.SpanContextFromContext(ctx)
}

// ContextWithTraceParent returns ctx carrying the remote span a W3C
// traceparent names, so that an instance started with it joins that trace
// as a child of that span. An invalid traceparent is an error.
func ContextWithTraceParent(ctx context.Context, traceParent string) (context.Context, error) {
	sc := parseTraceParent(traceParent)
	if !sc.IsValid() {
		return ctx, errors.New("invalid traceparent: want the W3C form 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, such as 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), nil
}

// startAttempt starts the span of one attempt, a child of its instance's.
func (t *tracing) startAttempt(ctx context.Context, step *storage.ClaimedStep) (context.Context, trace.Span) {
	if parent := parseTraceParent(step.TraceParent); parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	attrs := []attribute.KeyValue{
		attrWorkflow.String(step.Workflow), attrInstance.String(step.InstanceID),
		attrStep.String(step.Step), attrAttempt.Int(step.Attempt),
	}
	if step.Item >= 0 {
		attrs = append(attrs, attrItem.Int(step.Item))
	}
	return t.tracer.Start(ctx, "step "+step.Step, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// endAttempt ends an attempt's span with what became of the attempt.
func endAttempt(span trace.Span, result storage.StepResult, recorded bool) {
	if !recorded {
		span.SetAttributes(attrOutcome.String("abandoned"))
		span.SetStatus(codes.Error, "the attempt was stopped: its step was cancelled, claimed again or released")
		span.End()
		return
	}
	span.SetAttributes(attrOutcome.String(outcomeName(result.Outcome)))
	if result.Outcome == storage.OutcomeRetry || result.Outcome == storage.OutcomeFailed {
		span.SetAttributes(semconv.ErrorTypeOther)
		span.SetStatus(codes.Error, result.Error)
	}
	span.End()
}

// endInstance emits the span of a finished instance, with the IDs chosen
// at its start, from its creation to now. An instance that finishes again
// after a retry (rerunAt, the retry's time) already sent that span: the
// new run's span is the instance span's child, from the retry on, with an
// ID of its own, for a trace backend keeps one span per ID.
func (t *tracing) endInstance(inst *storage.Instance, rerunAt *time.Time) {
	sc := parseTraceParent(inst.TraceParent)
	if !sc.IsValid() {
		return // started with tracing off
	}
	start := inst.CreatedAt
	attrs := []attribute.KeyValue{attrWorkflow.String(inst.Workflow), attrInstance.String(inst.ID), attrStatus.String(string(inst.Status))}
	var ctx context.Context
	if rerunAt != nil {
		// A child of the instance span, with an ID the provider picks.
		ctx = trace.ContextWithRemoteSpanContext(context.Background(), sc)
		start = *rerunAt
		attrs = append(attrs, attrRetried.Bool(true))
	} else {
		ctx = context.WithValue(context.Background(), presetIDsKey{}, presetIDs{traceID: sc.TraceID(), spanID: sc.SpanID()})
		if caller, err := trace.SpanIDFromHex(inst.TraceCaller); err == nil && caller.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: sc.TraceID(), SpanID: caller, TraceFlags: sc.TraceFlags(), Remote: true,
			}))
		}
	}
	end := time.Now()
	if inst.FinishedAt != nil {
		end = *inst.FinishedAt
	}
	_, span := t.tracer.Start(ctx, "workflow "+inst.Workflow, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if inst.Status != storage.InstanceCompleted {
		span.SetAttributes(semconv.ErrorTypeKey.String(string(inst.Status)))
		span.SetStatus(codes.Error, inst.Error)
	}
	if got := span.SpanContext(); rerunAt == nil && got.IsValid() && got.SpanID() != sc.SpanID() {
		t.warnIDs.Do(func() {
			t.logger.Warn("dagrun: the TracerProvider does not use dagrun.TraceIDGenerator, so instance spans do not carry the IDs their attempts name as parent; build it with sdktrace.WithIDGenerator(dagrun.TraceIDGenerator())")
		})
	}
	span.End(trace.WithTimestamp(end))
}

// lastRetry returns when the instance was last retried (by RetryInstance
// or RetryFrom), nil if never: from the latest events GetInstance read,
// or, when the history is longer, from the whole of it, a page at a time.
func (e *Engine) lastRetry(ctx context.Context, inst *storage.Instance) (*time.Time, error) {
	find := func(events []storage.Event) *time.Time {
		for i := len(events) - 1; i >= 0; i-- {
			if events[i].Type == storage.EventInstanceRetried {
				at := events[i].At
				return &at
			}
		}
		return nil
	}
	if at := find(inst.Events); at != nil || !inst.EventsTruncated {
		return at, nil
	}
	var last *time.Time
	for after := int64(0); ; {
		page, err := e.store.ListEvents(ctx, storage.EventsParams{InstanceID: inst.ID, AfterID: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		if at := find(page); at != nil {
			last = at
		}
		if len(page) < 1000 {
			return last, nil
		}
		after = page[len(page)-1].ID
	}
}

// endInstances emits the spans of instances that finished, reading them
// back for their trace context and times: a read per instance, only when
// tracing is on.
func (e *Engine) endInstances(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range ids {
		inst, err := e.store.GetInstance(ctx, id)
		if err != nil {
			// Started in a caller's transaction that rolled back, or pruned.
			e.logger.Debug("dagrun: no span for a finished instance", slog.String("instance", id), slog.Any("error", err))
			continue
		}
		e.endInstanceSpan(ctx, inst)
	}
}

// endInstanceSpan emits the span of a finished instance read back, of
// its first run or of its latest rerun (see endInstance).
func (e *Engine) endInstanceSpan(ctx context.Context, inst *storage.Instance) {
	rerunAt, err := e.lastRetry(ctx, inst)
	if err != nil {
		e.logger.Debug("dagrun: no span for a finished instance", slog.String("instance", inst.ID), slog.Any("error", err))
		return
	}
	e.tracing.endInstance(inst, rerunAt)
}
