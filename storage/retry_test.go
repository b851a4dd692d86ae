package storage_test

import (
	"math"
	"testing"
	"time"

	"github.com/dagrun/dagrun/storage"
)

func TestRetryDelay(t *testing.T) {
	tests := []struct {
		name    string
		policy  storage.RetryPolicy
		attempt int
		jitter  float64
		want    time.Duration
	}{
		{"first retry waits the backoff", storage.RetryPolicy{Backoff: time.Second, MaxBackoff: time.Minute}, 1, 0, time.Second},
		{"doubles per attempt", storage.RetryPolicy{Backoff: time.Second, MaxBackoff: time.Minute}, 4, 0, 8 * time.Second},
		{"capped by MaxBackoff", storage.RetryPolicy{Backoff: time.Second, MaxBackoff: time.Minute}, 30, 0, time.Minute},
		{"jitter takes up to a fifth off", storage.RetryPolicy{Backoff: 10 * time.Second}, 1, 0.5, 9 * time.Second},
		{"no backoff, no delay", storage.RetryPolicy{MaxBackoff: time.Minute}, 5, 0, 0},
		{"zero MaxBackoff at a high attempt stays positive and bounded", storage.RetryPolicy{Backoff: time.Second}, 1000, 0, storage.MaxDelay},
		{"huge MaxBackoff at the largest attempt", storage.RetryPolicy{Backoff: time.Hour, MaxBackoff: math.MaxInt64}, math.MaxInt32, 0.999, storage.MaxDelay - time.Duration(float64(storage.MaxDelay)*0.2*0.999)},
		{"backoff above the bound", storage.RetryPolicy{Backoff: math.MaxInt64}, 2, 0, storage.MaxDelay},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.policy.Delay(tt.attempt, tt.jitter)
			if got != tt.want {
				t.Fatalf("Delay(%d, %v) = %s, want %s", tt.attempt, tt.jitter, got, tt.want)
			}
			if got < 0 {
				t.Fatalf("negative delay %s", got)
			}
		})
	}
}
