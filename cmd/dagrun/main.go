// Command dagrun runs durable declarative DAG workflows. It registers the
// built-in handlers and the order-processing example handlers; a binary of
// your own registers yours and calls app.Main the same way.
package main

import (
	"os"

	"github.com/dagrun/dagrun/cmd/dagrun/app"
	"github.com/dagrun/dagrun/examples/orders"
	"github.com/dagrun/dagrun/handlers"
)

func main() {
	registry := handlers.NewRegistry()
	handlers.RegisterBuiltins(registry)
	orders.Register(registry)
	os.Exit(app.Main(registry))
}
