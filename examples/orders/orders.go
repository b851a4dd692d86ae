// Package orders holds the handlers of the order-processing workflow
// (workflows/order-processing.yaml): validate an order, charge for it, ship
// it and notify the customer. They stand in for calls to real services, so
// the workflow runs anywhere with no setup, while showing how a real handler
// deals with retries: the charge is idempotent, bad input fails permanently,
// and every output is derived deterministically from the input.
//
// Register them with [Register] (cmd/dagrun does) or, to inspect the fake
// payment provider in a test, with [RegisterWith].
package orders

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/dagrun/dagrun/handlers"
)

// Handler names, as the workflow refers to them.
const (
	Validate = "orders.validate"
	Charge   = "orders.charge"
	Ship     = "orders.ship"
	Notify   = "orders.notify"
)

// Register registers the order handlers on r with a fresh in-memory payment
// provider. It panics if a name is taken, like [handlers.Registry.Register].
func Register(r *handlers.Registry) {
	RegisterWith(r, NewPayments())
}

// RegisterWith registers the order handlers on r, charging through p.
func RegisterWith(r *handlers.Registry, p *Payments) {
	if p == nil {
		panic("orders: RegisterWith called with nil Payments")
	}
	r.Register(Validate, handlers.Typed(validate))
	r.Register(Charge, handlers.Typed(p.charge))
	r.Register(Ship, handlers.Typed(ship))
	r.Register(Notify, handlers.Typed(notify))
}

// ValidateInput is the input of orders.validate.
type ValidateInput struct {
	OrderID string `json:"orderId"`
	// Items are the order lines; only their number matters here.
	Items []any `json:"items"`
}

// ValidateOutput is the output of orders.validate.
type ValidateOutput struct {
	OrderID   string `json:"orderId"`
	ItemCount int    `json:"itemCount"`
}

// validate fails permanently on a malformed order: the input will be the
// same on every attempt, so retrying could only fail again.
func validate(_ context.Context, in ValidateInput) (ValidateOutput, error) {
	if strings.TrimSpace(in.OrderID) == "" {
		return ValidateOutput{}, handlers.Permanent(errors.New("order has no orderId"))
	}
	if len(in.Items) == 0 {
		return ValidateOutput{}, handlers.Permanent(fmt.Errorf("order %s has no items", in.OrderID))
	}
	return ValidateOutput{OrderID: in.OrderID, ItemCount: len(in.Items)}, nil
}

// ChargeInput is the input of orders.charge.
type ChargeInput struct {
	// Amount is in the order's currency. A real integration would take
	// integer minor units (cents); the workflow passes the JSON number from
	// its input as is.
	Amount float64 `json:"amount"`
	// IdempotencyKey makes retries safe: every charge with the same key is
	// the same charge. The workflow passes "charge-<orderId>", so even two
	// instances for one order charge once. When empty, the step's own key
	// (handlers.StepInfo.IdempotencyKey) is used, which covers retries of
	// the step.
	IdempotencyKey string `json:"idempotencyKey"`
}

// ChargeOutput is the output of orders.charge.
type ChargeOutput struct {
	PaymentID string  `json:"paymentId"`
	Amount    float64 `json:"amount"`
}

// Payments is a fake payment provider that keeps its charges in memory.
// It is safe for concurrent use.
//
// It models what makes a charge safe to retry: the caller sends an
// idempotency key with each charge, and the provider charges at most once per
// key, answering a repeated key with the original payment. Because the
// handler may run again after a crash or a lost lease, dedupe must live in
// the provider and not in the handler's own memory: a real integration sends
// the key to the provider (for example as Stripe's Idempotency-Key header)
// and keeps no state of its own. This fake keeps its state in the process,
// so it forgets everything on restart, which a real provider does not.
type Payments struct {
	mu    sync.Mutex
	byKey map[string]Payment
}

// Payment is one charge made by [Payments].
type Payment struct {
	ID             string
	Amount         float64
	IdempotencyKey string
}

// NewPayments returns a provider with no charges.
func NewPayments() *Payments {
	return &Payments{byKey: make(map[string]Payment)}
}

// Charge charges amount once per idempotency key: a repeated key returns the
// first payment and charges nothing. Reusing a key for a different amount is
// an error, as it is with real providers, since it means two different
// charges were given the same key.
func (p *Payments) Charge(key string, amount float64) (Payment, error) {
	if key == "" {
		return Payment{}, errors.New("payments: idempotency key is required")
	}
	if amount < 0 {
		return Payment{}, fmt.Errorf("payments: amount must not be negative, got %v", amount)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if prev, ok := p.byKey[key]; ok {
		if prev.Amount != amount {
			return Payment{}, fmt.Errorf("payments: idempotency key %q was used for amount %v, not %v",
				key, prev.Amount, amount)
		}
		return prev, nil
	}
	pay := Payment{ID: fmt.Sprintf("pay_%06d", len(p.byKey)+1), Amount: amount, IdempotencyKey: key}
	p.byKey[key] = pay
	return pay, nil
}

// Count returns the number of charges made.
func (p *Payments) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byKey)
}

func (p *Payments) charge(ctx context.Context, in ChargeInput) (ChargeOutput, error) {
	key := in.IdempotencyKey
	if key == "" {
		key = handlers.Info(ctx).IdempotencyKey
	}
	// The fake provider's errors are all about the request itself, so none
	// is worth retrying; a real client would return network and 5xx errors
	// unwrapped so that they are retried.
	pay, err := p.Charge(key, in.Amount)
	if err != nil {
		return ChargeOutput{}, handlers.Permanent(err)
	}
	return ChargeOutput{PaymentID: pay.ID, Amount: pay.Amount}, nil
}

// ShipInput is the input of orders.ship.
type ShipInput struct {
	PaymentID string `json:"paymentId"`
}

// ShipOutput is the output of orders.ship.
type ShipOutput struct {
	TrackingNo string `json:"trackingNo"`
}

// ship derives the tracking number from the payment, so a retried shipment
// gets the same number: the shape a real carrier API gives when the payment
// ID is its idempotency key.
func ship(_ context.Context, in ShipInput) (ShipOutput, error) {
	if in.PaymentID == "" {
		return ShipOutput{}, handlers.Permanent(errors.New("ship: paymentId is required"))
	}
	sum := sha256.Sum256([]byte(in.PaymentID))
	return ShipOutput{TrackingNo: "TRK-" + strings.ToUpper(hex.EncodeToString(sum[:5]))}, nil
}

// NotifyInput is the input of orders.notify.
type NotifyInput struct {
	To         string `json:"to"`
	TrackingNo string `json:"trackingNo"`
}

// NotifyOutput is the output of orders.notify.
type NotifyOutput struct {
	Sent bool   `json:"sent"`
	To   string `json:"to"`
}

// notify pretends to send the customer their tracking number.
func notify(_ context.Context, in NotifyInput) (NotifyOutput, error) {
	if in.To == "" {
		return NotifyOutput{}, handlers.Permanent(errors.New("notify: to is required"))
	}
	return NotifyOutput{Sent: true, To: in.To}, nil
}
