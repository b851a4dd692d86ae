package dagrun

import "testing"

// TestHasDuplicateKey: the byte scan finds a key written twice in one
// object, whatever the nesting, the escapes, or the text in values, and
// only then.
func TestHasDuplicateKey(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		`{"a":1,"a":2}`:                       true,
		`{"a":1,"b":{"a":1}}`:                 false,
		`{"a":"\"a\"","b":[{"c":1},{"c":2}]}`: false,
		`{"a\u0062":1,"ab":2}`:                true,
		`[{"x":{"y":[1,{"z":1,"z":2}]}}]`:     true,
		`{"k":"a,\"b\":1","b":1}`:             false,
		`"str"`:                               false,
		`{}`:                                  false,
		`{"a":{"b":1},"b":2}`:                 false,
		`{"a":[1,2],"a":3}`:                   true,
		`{"a":{"x":1},"c":{"x":1},"a":1}`:     true,
		`{"s":"\\","t":"\\\"","s2":1,"t2":2}`: false,
	} {
		if got := hasDuplicateKey([]byte(raw)); got != want {
			t.Errorf("hasDuplicateKey(%s) = %v, want %v", raw, got, want)
		}
	}
}

// BenchmarkDuplicateKey is the check's cost on a start's input.
func BenchmarkDuplicateKey(b *testing.B) {
	raw := []byte(`{"orderId": "A-1001", "items": [{"sku": "book", "qty": 2}, {"sku": "pen", "qty": 10}], "totalAmount": 42.5, "customerEmail": "ada@example.com"}`)
	b.ReportAllocs()
	for b.Loop() {
		duplicateKey(raw)
	}
}
