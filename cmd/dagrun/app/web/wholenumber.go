package web

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
)

// wholeNumber is a request field that takes a whole number, written as
// JSON writes one: 5, and 5.0 or 5e0 too, since JSON does not tell them
// apart and some clients send every number as a float (Python's 5.0). A
// fraction, or a value past 2^53 written as a float, is refused as an int
// field refuses it.
type wholeNumber int

func (n *wholeNumber) UnmarshalJSON(b []byte) error {
	text := string(b)
	if text == "null" {
		return nil // as for an int: no change
	}
	if i, err := strconv.ParseInt(text, 10, 0); err == nil {
		*n = wholeNumber(i)
		return nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		// Named as encoding/json names what an int field cannot take.
		what := "number " + text
		switch b[0] {
		case '"':
			what = "string"
		case 't', 'f':
			what = "bool"
		case '{':
			what = "object"
		case '[':
			what = "array"
		}
		return &json.UnmarshalTypeError{Value: what, Type: reflect.TypeFor[int]()}
	}
	*n = wholeNumber(f)
	return nil
}
