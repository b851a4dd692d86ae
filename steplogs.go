package dagrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// DefaultStepLogBytes is how much of what one attempt logs is kept: its
// last 64 KiB.
const DefaultStepLogBytes = 64 << 10

// logFlushInterval is how often a worker writes what its handlers logged:
// one store transaction for all its attempts, so a step's logs show up
// while it runs at a cost that does not grow with the steps it runs.
const logFlushInterval = 200 * time.Millisecond

// Bounds of one record: a longer message or attribute set is cut (the
// attempt's bound applies on top).
const (
	maxLogMessageBytes = 16 << 10
	maxLogAttrsBytes   = 16 << 10
)

// recordOverhead is what a record counts for beyond its message and
// attributes, so that many empty records are bounded too.
const recordOverhead = 32

// logWriter writes what a worker's handlers log to the store, in batches.
type logWriter struct {
	store  storage.Store
	logger *slog.Logger
	limit  int

	mu    sync.Mutex
	dirty []*attemptLog // attempts with records or trims to write
}

func newLogWriter(store storage.Store, logger *slog.Logger, limit int) *logWriter {
	return &logWriter{store: store, logger: logger, limit: limit}
}

// run writes every logFlushInterval until ctx ends, then writes what is
// left once more.
func (lw *logWriter) run(ctx context.Context) {
	tick := time.NewTicker(logFlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			lw.flush()
			return
		case <-tick.C:
			lw.flush()
		}
	}
}

// flush writes what every dirty attempt has to write, in one transaction.
// Logs are best effort: a failed write is reported and not retried, so a
// database that is down never holds records piling up in memory.
func (lw *logWriter) flush() {
	lw.mu.Lock()
	dirty := lw.dirty
	lw.dirty = nil
	lw.mu.Unlock()
	if len(dirty) == 0 {
		return
	}
	var (
		trims   []storage.LogTrim
		records []storage.LogRecord
	)
	for _, al := range dirty {
		trim, recs := al.take()
		if trim.Drop > 0 {
			trims = append(trims, trim)
		}
		records = append(records, recs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lw.store.AppendLogs(ctx, trims, records); err != nil {
		lw.logger.Warn("dagrun: step logs not stored", slog.Int("records", len(records)), slog.Any("error", err))
	}
}

func (lw *logWriter) markDirty(al *attemptLog) {
	lw.mu.Lock()
	lw.dirty = append(lw.dirty, al)
	lw.mu.Unlock()
}

// attemptLog keeps what one attempt logs, bounded to its writer's limit:
// the records not yet written, and the sizes of those written (oldest
// first, a marker of size 0 in front once some were dropped), so that it
// knows how many stored records to drop when newer ones push the attempt
// over its bound.
type attemptLog struct {
	writer *logWriter
	id     attemptIdentity

	mu           sync.Mutex
	buf          []byte // where attributes are rendered
	pending      []storage.LogRecord
	pendingBytes int
	written      []int
	writtenBytes int
	dropWritten  int   // stored records to drop at the next write
	dropped      int64 // bytes dropped so far
	markerDue    bool  // a marker is to be written or updated
	queued       bool  // in the writer's dirty list

	// handler is the attempt logger's own, allocated with it.
	handler logHandler

	// Room for what most attempts log, allocated with the attemptLog
	// rather than one allocation each on its first record: a worker
	// running short steps that log pays them for every attempt. Kept
	// small: the collector scans all of it, for every attempt that logs
	// (the attributes' buffer, holding no pointers, costs it nothing and
	// is allocated apart).
	firstPending [1]storage.LogRecord
	firstWritten [2]int
}

// attrsBufferSize is what an attempt's attribute buffer starts with.
const attrsBufferSize = 128

// attemptIdentity is what names an attempt's records.
type attemptIdentity struct {
	stepID           int64
	instanceID, step string
	item, attempt    int
}

// record is a record of the attempt, its other fields unset.
func (id *attemptIdentity) record() storage.LogRecord {
	return storage.LogRecord{StepID: id.stepID, InstanceID: id.instanceID, Step: id.step, Item: id.item, Attempt: id.attempt}
}

func identityOf(step *storage.ClaimedStep) attemptIdentity {
	return attemptIdentity{stepID: step.StepID, instanceID: step.InstanceID, step: step.Step, item: step.Item, attempt: step.Attempt}
}

// newAttemptLog returns the log of the attempt id, kept by lw.
func newAttemptLog(lw *logWriter, id attemptIdentity) *attemptLog {
	al := &attemptLog{writer: lw, id: id}
	al.handler = logHandler{log: al, attrs: newAttrsJSON()}
	// The result that takes the pending records owns them from then on:
	// take leaves pending nil, so later records are appended elsewhere.
	al.pending, al.written = al.firstPending[:0], al.firstWritten[:0]
	return al
}

// lazyAttemptLog is the slog.Handler an attempt's context carries: it
// makes the attempt's log on its first record. Most attempts log
// nothing, and an attemptLog, with room for its first records, is about a
// kilobyte: allocating it for every attempt cost a handler that logs
// nothing three times what the rest of its attempt costs (BenchmarkHotPaths).
type lazyAttemptLog struct {
	writer *logWriter
	id     attemptIdentity
	log    atomic.Pointer[attemptLog]
}

func newLazyAttemptLog(lw *logWriter, step *storage.ClaimedStep) *lazyAttemptLog {
	return &lazyAttemptLog{writer: lw, id: identityOf(step)}
}

// get returns the attempt's log, made by whichever of the handler's
// goroutines logs first.
func (l *lazyAttemptLog) get() *attemptLog {
	if al := l.log.Load(); al != nil {
		return al
	}
	al := newAttemptLog(l.writer, l.id)
	if !l.log.CompareAndSwap(nil, al) {
		return l.log.Load()
	}
	return al
}

// take is attemptLog.take for an attempt that may have logged nothing.
func (l *lazyAttemptLog) take() (storage.LogTrim, []storage.LogRecord) {
	if al := l.log.Load(); al != nil {
		return al.take()
	}
	return storage.LogTrim{}, nil
}

func (l *lazyAttemptLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *lazyAttemptLog) Handle(ctx context.Context, r slog.Record) error {
	return l.get().handler.Handle(ctx, r)
}

func (l *lazyAttemptLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return l
	}
	return l.get().handler.WithAttrs(attrs)
}

func (l *lazyAttemptLog) WithGroup(name string) slog.Handler {
	if name == "" {
		return l
	}
	return l.get().handler.WithGroup(name)
}

func recordSize(r *storage.LogRecord) int { return len(r.Message) + len(r.Attrs) + recordOverhead }

// addLocked keeps a record, dropping the oldest ones past the bound; the
// caller holds al.mu.
func (al *attemptLog) addLocked(r storage.LogRecord) {
	al.pending = append(al.pending, r)
	al.pendingBytes += recordSize(&r)
	for al.writtenBytes+al.pendingBytes > al.writer.limit {
		if len(al.written) > 0 {
			size := al.written[0]
			al.written = al.written[1:]
			al.writtenBytes -= size
			al.dropWritten++
			al.dropped += int64(size)
		} else {
			size := recordSize(&al.pending[0])
			al.pending = slices.Delete(al.pending, 0, 1)
			al.pendingBytes -= size
			al.dropped += int64(size)
		}
		al.markerDue = true
	}
	if !al.queued {
		al.queued = true
		al.writer.markDirty(al)
	}
}

// take hands the writer what to write, and counts it as written.
func (al *attemptLog) take() (storage.LogTrim, []storage.LogRecord) {
	al.mu.Lock()
	defer al.mu.Unlock()
	al.queued = false
	var trim storage.LogTrim
	records := al.pending
	if al.markerDue {
		marker := fmt.Sprintf("… %d bytes of earlier logs dropped", al.dropped)
		if al.dropWritten > 0 {
			// The newest dropped record becomes the marker, in its place.
			trim = storage.LogTrim{InstanceID: al.id.instanceID, Step: al.id.step, Item: al.id.item,
				Attempt: al.id.attempt, Drop: al.dropWritten, Marker: marker}
		} else {
			// Nothing stored was dropped: none was stored, so the marker
			// is the first record written.
			m := al.id.record()
			m.Time, m.Level, m.Message = time.Now(), slog.LevelInfo.String(), marker
			records = append([]storage.LogRecord{m}, records...)
		}
		al.written = append([]int{0}, al.written...)
	}
	for i := range al.pending {
		al.written = append(al.written, recordSize(&al.pending[i]))
	}
	al.writtenBytes += al.pendingBytes
	al.pending, al.pendingBytes, al.dropWritten, al.markerDue = nil, 0, 0, false
	return trim, records
}

// logHandler is the slog.Handler of one attempt's logger. The record's
// attributes, with those of WithAttrs and the open groups, are rendered as
// a JSON object the way slog's JSON handler renders them (see attrsJSON),
// into the attempt's buffer.
type logHandler struct {
	log   *attemptLog
	attrs attrsJSON
}

func (h *logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := h.log.id.record()
	rec.Time, rec.Level, rec.Message = r.Time, r.Level.String(), cutText(r.Message, maxLogMessageBytes)
	if rec.Time.IsZero() {
		rec.Time = time.Now()
	}
	al := h.log
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.buf == nil {
		al.buf = make([]byte, 0, attrsBufferSize)
	}
	al.buf = h.attrs.render(al.buf[:0], r)
	rec.Attrs = keptAttrs(al.buf)
	al.addLocked(rec)
	return nil
}

func (h *logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return &logHandler{log: h.log, attrs: h.attrs.withAttrs(attrs)}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &logHandler{log: h.log, attrs: h.attrs.withGroup(name)}
}

// keptAttrs keeps a rendered attribute object: nil when it is empty, a
// note of its size instead when it is too large to keep.
func keptAttrs(b []byte) json.RawMessage {
	if len(b) == 0 || string(b) == "{}" {
		return nil
	}
	if len(b) > maxLogAttrsBytes {
		return json.RawMessage(fmt.Sprintf(`{"!dropped":"%d bytes of attributes"}`, len(b)))
	}
	return bytes.Clone(b)
}
