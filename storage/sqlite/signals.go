package sqlite

import (
	"context"
	"errors"
	"time"

	"github.com/dagrun/dagrun/storage"
)

// SendSignal implements storage.Store.
func (s *Store) SendSignal(ctx context.Context, p storage.SignalParams, plan storage.PlanFunc) (storage.SignalResult, error) {
	return storage.SignalResult{}, errors.New("not implemented")
}

// ExpireWaits implements storage.Store.
func (s *Store) ExpireWaits(ctx context.Context, limit int, plan storage.PlanFunc) (int, error) {
	return 0, nil
}

// NextWake implements storage.Store.
func (s *Store) NextWake(ctx context.Context, p storage.ClaimParams) (time.Time, error) {
	return time.Time{}, nil
}
