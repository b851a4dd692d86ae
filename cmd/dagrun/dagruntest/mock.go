package dagruntest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/dagrun/dagrun/dag"
	"github.com/dagrun/dagrun/handlers"
)

// SafeBuiltins are the handlers an unmocked step runs for real: they touch
// nothing outside the instance. Every other handler (http, and a binary's
// own) must be mocked or marked real: true, so that a test never charges a
// card or calls a server by accident.
var SafeBuiltins = []string{"echo", "noop", "sleep"}

// mockRegistry builds, for one case, a registry whose every handler name
// (the real registry's and every name the workflows use, so that a
// workflow can be tested before its handlers exist) answers by the case's
// mocks, keyed by the step the engine runs.
func mockRegistry(real *handlers.Registry, workflows []*dag.Workflow, tested string, mocks map[string]*Mock, problems *problemLog) *handlers.Registry {
	names := real.Names()
	for _, w := range workflows {
		for _, s := range w.AllSteps() {
			if s.Handler != "" && !slices.Contains(names, s.Handler) {
				names = append(names, s.Handler)
			}
		}
	}
	r := handlers.NewRegistry()
	for _, name := range names {
		realHandler, registered := real.Lookup(name)
		r.Register(name, func(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
			info := handlers.Info(ctx)
			key := info.Step
			if info.Workflow != tested {
				key = info.Workflow + "/" + info.Step
			}
			mock := mocks[key]
			reply := Reply{Real: true}
			if mock != nil {
				reply = mock.reply(info.Attempt)
			} else if !slices.Contains(SafeBuiltins, name) {
				err := fmt.Errorf("step %s (handler %s) is not mocked: add steps: {%s: {output: ...}} to the case, or {real: true} to run the registered handler", key, name, key)
				problems.add(err.Error())
				return nil, handlers.Permanent(err)
			}
			switch {
			case reply.Real && !registered:
				err := fmt.Errorf("step %s: handler %s is not registered in this binary, so real: true cannot run it; mock its output instead", key, name)
				problems.add(err.Error())
				return nil, handlers.Permanent(err)
			case reply.Real:
				return realHandler(ctx, input)
			case reply.PermanentError != "":
				return nil, handlers.Permanent(errors.New(reply.PermanentError))
			case reply.Error != "":
				return nil, errors.New(reply.Error)
			}
			return reply.Output, nil
		})
	}
	return r
}

// problemLog collects what made a case unable to run as written (a step
// nobody mocked); each is reported once.
type problemLog struct {
	mu   sync.Mutex
	list []string
}

func (l *problemLog) add(msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Contains(l.list, msg) {
		l.list = append(l.list, msg)
	}
}

func (l *problemLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.list)
}
