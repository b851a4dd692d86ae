package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// syncBuffer is a bytes.Buffer safe to read while a process writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// process is a dagrun process running in the background (a worker, a
// server, a start that follows its instance) that tests stop, kill, pause
// and resume.
type process struct {
	args   []string
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
	code   int
}

// spawn starts the e2e binary in the background.
func (e *env) spawn(t *testing.T, args ...string) *process {
	t.Helper()
	return e.spawnBinary(t, binary, args...)
}

// spawnPlain starts the plain binary in the background: for the crash,
// fault and fencing tests, which kill, restart and starve their workers
// over and over. What they test is what survives that, not what the race
// detector sees, and race-built processes cost them 51 s of CPU more than
// plain ones on a 2-core VM (these tests with two that start few workers,
// DAGRUN_E2E_NORACE unset and set: 142.7 s against 91.8), about a
// twentieth of what a CI run's tests cost there.
func (e *env) spawnPlain(t *testing.T, args ...string) *process {
	t.Helper()
	return e.spawnBinary(t, plainBinary, args...)
}

// spawnBinary starts bin (the race-enabled e2e binary or the plain one) in
// the background. It is killed at the end of the test if it still runs,
// and its stderr must show no data race.
func (e *env) spawnBinary(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	p := &process{args: args, done: make(chan struct{})}
	p.cmd = e.command(context.Background(), args...)
	p.cmd.Path, p.cmd.Args[0] = bin, bin
	// A race-enabled binary otherwise sleeps a second before exiting.
	p.cmd.Env = append(p.cmd.Env, "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, p.cmd.Start())
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		if exitErr, ok := err.(*exec.ExitError); ok {
			p.code = exitErr.ExitCode()
		} else if err != nil {
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		if p.running() {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("data race in dagrun %v:\n%s", p.args, p.stderr.String())
		}
	})
	return p
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *process) kill(t *testing.T) {
	t.Helper()
	require.True(t, p.running(), "dagrun %v exited before it could be killed (code %d):\n%s", p.args, p.code, p.stderr.String())
	require.NoError(t, p.cmd.Process.Kill())
	<-p.done
}

func (p *process) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// wait waits for the process to exit by itself and returns its exit code.
func (p *process) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("dagrun %v still running after %s\nstderr:\n%s", p.args, timeout, p.stderr.String())
	}
	return p.code
}

// stop sends SIGTERM, as a service manager does, and requires a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, p.wait(t, 30*time.Second), "dagrun %v exit code; stderr:\n%s", p.args, p.stderr.String())
}

// peakRSSKiB is the process's peak resident set size, once it has exited.
func (p *process) peakRSSKiB() int64 {
	if usage, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		return usage.Maxrss // KiB on Linux
	}
	return 0
}
