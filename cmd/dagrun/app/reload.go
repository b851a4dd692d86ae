package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/dagrun/dagrun"
	"github.com/dagrun/dagrun/dag"
)

const (
	// reloadSettle is how long the workflows folder must stay unchanged
	// before it is read again: an editor's save or a deployment writes
	// several files, or one file in several steps (a temporary file, then
	// a rename), and one reload should see them all.
	reloadSettle = 200 * time.Millisecond
	// reloadPoll is how often a folder that cannot be watched (no inotify
	// instances left, a network file system) is listed for changes.
	reloadPoll = 2 * time.Second
)

// watchWorkflows keeps engine's workflows as the folder holds them, for
// the commands that run on (worker, serve): a workflow added, edited or
// removed is started (API, scheduler) as the folder has it now, without
// a restart, as one-shot commands always read the folder afresh. Running
// instances keep the definition they started with. A file with errors is
// refused as at start, and the rest still load; a folder removed leaves
// no workflow, as at start, and one that cannot be read keeps the
// workflows already loaded. changed runs after each reload
// that changed a workflow. It returns when ctx ends.
func (c *cli) watchWorkflows(ctx context.Context, engine *dagrun.Engine, changed func()) {
	dir := c.workflowsDir
	events, stop := folderChanges(ctx, dir, c.loadedFolder, c.logger)
	defer stop()
	current := workflowHashes(engine.Workflows())
	currentLeftOut := slices.Sorted(maps.Keys(c.invalid))
	for {
		select {
		case <-ctx.Done():
			return
		case <-events:
		}
		// Settle: wait until the folder has been quiet for reloadSettle.
		for settled := false; !settled; {
			select {
			case <-ctx.Done():
				return
			case <-events:
			case <-time.After(reloadSettle):
				settled = true
			}
		}
		workflows, invalid, err := c.loadCatalog(ctx)
		if err == nil {
			err = engine.SetWorkflows(workflows, invalid)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.logger.Warn("workflows folder not reloaded; the workflows loaded before stay", "folder", dir, slog.Any("error", err))
			continue
		}
		next := workflowHashes(workflows)
		nextLeftOut := slices.Sorted(maps.Keys(invalid))
		if maps.Equal(current, next) && slices.Equal(currentLeftOut, nextLeftOut) {
			continue
		}
		added, edited, removed := diffWorkflows(current, next)
		// leftOut tells when a broken file was fixed or removed, too:
		// the warnings of the files left out stop.
		c.logger.Info("workflows reloaded", "folder", dir, "workflows", len(next),
			"added", strings.Join(added, ","), "changed", strings.Join(edited, ","), "removed", strings.Join(removed, ","),
			"leftOut", strings.Join(nextLeftOut, ","))
		current, currentLeftOut = next, nextLeftOut
		if len(added)+len(edited)+len(removed) > 0 {
			changed()
		}
	}
}

// workflowHashes maps each workflow's name to its definition's hash.
func workflowHashes(workflows []*dag.Workflow) map[string]string {
	out := make(map[string]string, len(workflows))
	for _, w := range workflows {
		out[w.Name] = w.Hash
	}
	return out
}

// diffWorkflows names the workflows of next that before lacked, those
// whose definitions differ, and those next lacks, each sorted.
func diffWorkflows(before, next map[string]string) (added, changed, removed []string) {
	for name, hash := range next {
		switch old, ok := before[name]; {
		case !ok:
			added = append(added, name)
		case old != hash:
			changed = append(changed, name)
		}
	}
	for name := range before {
		if _, ok := next[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(added)
	slices.Sort(changed)
	slices.Sort(removed)
	return added, changed, removed
}

// folderChanges reports on events that dir's entries may have changed
// since they were as loaded describes them (folderFingerprint): at once
// if they changed before it watches, then from inotify (or the platform's
// equivalent) where dir can be watched, and from listing it every
// reloadPoll in any case. The listing catches what a watch cannot see: a
// watch follows the folder it was added on, so a folder deleted and made
// again, or a symlink switched to another release's folder (a common
// deploy), would go unseen for good; when the listing sees a change, the
// watch is added again on what dir names now. A folder that does not
// exist yet is listed until it does.
func folderChanges(ctx context.Context, dir, loaded string, logger *slog.Logger) (events <-chan struct{}, stop func()) {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		logger.Info("workflows folder polled for changes: it cannot be watched", "folder", dir, "every", reloadPoll, slog.Any("error", err))
		watcher = nil
	} else if err := watcher.Add(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		logger.Info("workflows folder polled for changes: it cannot be watched", "folder", dir, "every", reloadPoll, slog.Any("error", err))
	}
	// What changed between the load and the watch has no event.
	last := folderFingerprint(dir)
	if last != loaded {
		signal()
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var watched <-chan fsnotify.Event
		var failed <-chan error
		if watcher != nil {
			defer watcher.Close()
			watched, failed = watcher.Events, watcher.Errors
		}
		poll := time.NewTicker(reloadPoll)
		defer poll.Stop()
		// heard is whether the watch reported a change since the last
		// listing: that change was signalled already, and the listing
		// only takes it in rather than reloading it a second time.
		heard := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
				now := folderFingerprint(dir)
				if now == last {
					heard = false
					continue
				}
				if unreadable(now) && !unreadable(last) {
					logger.Warn("the workflows folder cannot be read: no workflow is started until it can", "folder", dir, "error", strings.TrimPrefix(now, unreadablePrefix))
				}
				last = now
				if !heard {
					signal()
				}
				heard = false
				if watcher != nil {
					_ = watcher.Remove(dir)
					_ = watcher.Add(dir) // the folder dir names now, if any
				}
			case _, ok := <-watched:
				if !ok {
					watched = nil
					continue
				}
				heard = true
				signal()
			case err, ok := <-failed:
				if !ok {
					failed = nil
					continue
				}
				// An overflow lost events: read the folder to be sure.
				logger.Warn("watching the workflows folder", "folder", dir, slog.Any("error", err))
				signal()
			}
		}
	}()
	return out, func() { cancel(); <-done }
}

// unreadablePrefix starts the fingerprint of a folder that cannot be read.
const unreadablePrefix = "unreadable: "

func unreadable(fingerprint string) bool { return strings.HasPrefix(fingerprint, unreadablePrefix) }

// folderFingerprint describes dir's entries by name, size and modification
// time, or says it cannot be read.
func folderFingerprint(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return unreadablePrefix + err.Error()
	}
	var sb strings.Builder
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			fmt.Fprintf(&sb, "%s gone\n", e.Name())
			continue
		}
		fmt.Fprintf(&sb, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return sb.String()
}

// followWorkflowsFolder runs watchWorkflows in the background, changed
// called after each change; stop ends it and waits.
func (c *cli) followWorkflowsFolder(ctx context.Context, engine *dagrun.Engine, changed func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.watchWorkflows(ctx, engine, changed)
	}()
	return func() { cancel(); <-done }
}
