package storage

import "time"

// A claim can commit on the database while its answer is lost: the
// connection drops as the commit is acknowledged (a terminated backend, a
// failover, a pooler restarting, an idle-timeout kill). Its worker sees an
// error, yet the steps it claimed are running under the worker's ID with a
// lease: nothing runs them and nothing renews them until the lease expires
// and counts the attempt as lost. AdoptSteps hands them to the worker.

// AdoptParams asks Store.AdoptSteps for the steps a worker holds without
// knowing it.
type AdoptParams struct {
	// WorkerID is the ClaimParams.WorkerID of the worker's claims.
	WorkerID string
	// Held are the claims the worker knows of: the steps it runs, and
	// those it let go of while their leases may still hold. AdoptSteps
	// leaves them alone.
	Held []Claim
	// Within, when positive, leaves alone the steps claimed longer ago
	// than that, by the store's clock: a worker passes how long it has
	// been running, so that a step claimed by an earlier process with the
	// same ID is never taken for its own. Zero: any.
	Within time.Duration
	// Lease is the adopted steps' new lease, from now; it must be
	// positive.
	Lease time.Duration
	// TraceParent asks for each step's ClaimedStep.TraceParent, as
	// ClaimParams.TraceParent does.
	TraceParent bool
}
