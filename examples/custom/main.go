// Command custom is a dagrun binary of your own: it registers its handlers
// next to the built-ins and reuses the whole dagrun command line (every
// verb, flag, output format and exit code) through app.Main.
//
//	go run ./examples/custom --workflows examples/custom/workflows start greet --input '{"name": "Ada"}'
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/handlers"
)

// GreetInput is what the greet.hello handler receives.
type GreetInput struct {
	Name string `json:"name"`
}

// GreetOutput is what it returns.
type GreetOutput struct {
	Greeting string `json:"greeting"`
}

func hello(_ context.Context, in GreetInput) (GreetOutput, error) {
	if strings.TrimSpace(in.Name) == "" {
		// Retrying cannot fix a missing name.
		return GreetOutput{}, handlers.Permanent(fmt.Errorf("name is empty"))
	}
	return GreetOutput{Greeting: "Hello, " + in.Name + "!"}, nil
}

func main() {
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	registry.Register("greet.hello", handlers.Typed(hello))
	os.Exit(app.Main(registry))
}
