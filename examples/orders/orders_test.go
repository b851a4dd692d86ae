package orders_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dagrun/dagrun/examples/orders"
	"github.com/dagrun/dagrun/handlers"
)

type testBundle struct {
	reg      *handlers.Registry
	payments *orders.Payments
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	b := &testBundle{reg: handlers.NewRegistry(), payments: orders.NewPayments()}
	orders.RegisterWith(b.reg, b.payments)
	return b
}

// run calls the named handler with input and returns its output as a string.
func (b *testBundle) run(t *testing.T, name, input string) (string, error) {
	t.Helper()
	return runCtx(t, b.reg, name, input, handlers.StepInfo{})
}

func runCtx(t *testing.T, reg *handlers.Registry, name, input string, info handlers.StepInfo) (string, error) {
	t.Helper()
	h, ok := reg.Lookup(name)
	require.True(t, ok, "handler %s not registered", name)
	ctx := t.Context()
	if info != (handlers.StepInfo{}) {
		ctx = handlers.WithInfo(ctx, info)
	}
	out, err := h(ctx, json.RawMessage(input))
	return string(out), err
}

func TestRegister(t *testing.T) {
	t.Parallel()
	r := handlers.NewRegistry()
	orders.Register(r)
	require.Equal(t, []string{"orders.charge", "orders.notify", "orders.ship", "orders.validate"}, r.Names())
	// Builtins and order handlers share a registry, as in cmd/dagrun.
	handlers.RegisterBuiltins(r)
	require.Len(t, r.Names(), 8)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		input   string
		want    string
		wantErr string
	}{
		{name: "OK", input: `{"orderId":"o-1","items":[{"sku":"a"},{"sku":"b"}]}`, want: `{"orderId":"o-1","itemCount":2}`},
		{name: "NoItems", input: `{"orderId":"o-1","items":[]}`, wantErr: "order o-1 has no items"},
		{name: "AbsentItems", input: `{"orderId":"o-2"}`, wantErr: "order o-2 has no items"},
		{name: "NoOrderID", input: `{"orderId":"","items":[1]}`, wantErr: "order has no orderId"},
		{name: "NullInput", input: `null`, wantErr: "order has no orderId"},
		{name: "ItemsNotAList", input: `{"orderId":"o-3","items":"a"}`, wantErr: "decode input for handler"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := setup(t).run(t, orders.Validate, tt.input)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.True(t, handlers.IsPermanent(err), "a bad order must not be retried")
				return
			}
			require.NoError(t, err)
			require.JSONEq(t, tt.want, out)
		})
	}
}

func TestCharge(t *testing.T) {
	t.Parallel()

	t.Run("IdempotentPerKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)

		first, err := b.run(t, orders.Charge, `{"amount":42.5,"idempotencyKey":"charge-o-1"}`)
		require.NoError(t, err)
		require.JSONEq(t, `{"paymentId":"pay_000001","amount":42.5}`, first)

		// A retry of the same charge: same payment, nothing charged again.
		again, err := b.run(t, orders.Charge, `{"amount":42.5,"idempotencyKey":"charge-o-1"}`)
		require.NoError(t, err)
		require.JSONEq(t, first, again)
		require.Equal(t, 1, b.payments.Count())

		// Another order is another charge.
		other, err := b.run(t, orders.Charge, `{"amount":10,"idempotencyKey":"charge-o-2"}`)
		require.NoError(t, err)
		require.JSONEq(t, `{"paymentId":"pay_000002","amount":10}`, other)
		require.Equal(t, 2, b.payments.Count())
	})

	t.Run("ConcurrentRetriesChargeOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		h, ok := b.reg.Lookup(orders.Charge)
		require.True(t, ok)
		outs := make([]json.RawMessage, 10)
		errs := make([]error, len(outs))
		var wg sync.WaitGroup
		for i := range outs {
			wg.Go(func() {
				// No require here: FailNow must run on the test goroutine.
				outs[i], errs[i] = h(t.Context(), json.RawMessage(`{"amount":5,"idempotencyKey":"charge-o-9"}`))
			})
		}
		wg.Wait()
		require.Equal(t, 1, b.payments.Count())
		for i := range outs {
			require.NoError(t, errs[i])
			require.JSONEq(t, string(outs[0]), string(outs[i]))
		}
	})

	t.Run("KeyFromStepInfo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		info := handlers.StepInfo{InstanceID: "i-1", Step: "charge", Attempt: 1, IdempotencyKey: "i-1/charge"}
		first, err := runCtx(t, b.reg, orders.Charge, `{"amount":3}`, info)
		require.NoError(t, err)
		info.Attempt = 2
		second, err := runCtx(t, b.reg, orders.Charge, `{"amount":3}`, info)
		require.NoError(t, err)
		require.JSONEq(t, first, second)
		require.Equal(t, 1, b.payments.Count())
	})

	t.Run("BadRequestsPermanent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.run(t, orders.Charge, `{"amount":5,"idempotencyKey":"k"}`)
		require.NoError(t, err)

		for _, tc := range []struct{ input, wantErr string }{
			{`{"amount":-1,"idempotencyKey":"k2"}`, "amount must not be negative"},
			{`{"amount":6,"idempotencyKey":"k"}`, `idempotency key "k" was used for amount 5, not 6`},
			{`{"amount":1}`, "idempotency key is required"},
			{`{"amount":"1","idempotencyKey":"k3"}`, "decode input for handler"},
		} {
			_, err := b.run(t, orders.Charge, tc.input)
			require.ErrorContains(t, err, tc.wantErr)
			require.True(t, handlers.IsPermanent(err), tc.input)
		}
		require.Equal(t, 1, b.payments.Count(), "a refused charge charges nothing")
	})

	t.Run("RegisterUsesFreshProvider", func(t *testing.T) {
		t.Parallel()
		r1, r2 := handlers.NewRegistry(), handlers.NewRegistry()
		orders.Register(r1)
		orders.Register(r2)
		for _, r := range []*handlers.Registry{r1, r2} {
			out, err := runCtx(t, r, orders.Charge, `{"amount":1,"idempotencyKey":"k"}`, handlers.StepInfo{})
			require.NoError(t, err)
			require.JSONEq(t, `{"paymentId":"pay_000001","amount":1}`, out)
		}
	})
}

func TestShip(t *testing.T) {
	t.Parallel()
	b := setup(t)

	out, err := b.run(t, orders.Ship, `{"paymentId":"pay_000001"}`)
	require.NoError(t, err)
	var got struct{ TrackingNo string }
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Regexp(t, `^TRK-[0-9A-F]{10}$`, got.TrackingNo)

	again, err := b.run(t, orders.Ship, `{"paymentId":"pay_000001"}`)
	require.NoError(t, err)
	require.JSONEq(t, out, again, "the tracking number must be deterministic")

	other, err := b.run(t, orders.Ship, `{"paymentId":"pay_000002"}`)
	require.NoError(t, err)
	require.NotEqual(t, out, other)

	_, err = b.run(t, orders.Ship, `{}`)
	require.ErrorContains(t, err, "paymentId is required")
	require.True(t, handlers.IsPermanent(err))
}

func TestNotify(t *testing.T) {
	t.Parallel()
	b := setup(t)

	out, err := b.run(t, orders.Notify, `{"to":"ada@example.com","trackingNo":"TRK-1"}`)
	require.NoError(t, err)
	require.JSONEq(t, `{"sent":true,"to":"ada@example.com"}`, out)

	_, err = b.run(t, orders.Notify, `{"trackingNo":"TRK-1"}`)
	require.ErrorContains(t, err, "to is required")
	require.True(t, handlers.IsPermanent(err))
}

// TestWorkflowChain runs the handlers in the order the workflow does, feeding
// each output into the next input, as order-processing.yaml maps them.
func TestWorkflowChain(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.run(t, orders.Validate, `{"orderId":"o-7","items":[{"sku":"a","qty":1}]}`)
	require.NoError(t, err)

	chargeOut, err := b.run(t, orders.Charge, `{"amount":19.99,"idempotencyKey":"charge-o-7"}`)
	require.NoError(t, err)
	var charge struct{ PaymentID string }
	require.NoError(t, json.Unmarshal([]byte(chargeOut), &charge))

	shipIn, err := json.Marshal(map[string]string{"paymentId": charge.PaymentID})
	require.NoError(t, err)
	shipOut, err := b.run(t, orders.Ship, string(shipIn))
	require.NoError(t, err)
	var shipped struct{ TrackingNo string }
	require.NoError(t, json.Unmarshal([]byte(shipOut), &shipped))

	notifyIn, err := json.Marshal(map[string]string{"to": "ada@example.com", "trackingNo": shipped.TrackingNo})
	require.NoError(t, err)
	out, err := b.run(t, orders.Notify, string(notifyIn))
	require.NoError(t, err)
	require.JSONEq(t, `{"sent":true,"to":"ada@example.com"}`, out)
}
