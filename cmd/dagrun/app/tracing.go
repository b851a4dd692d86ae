package app

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/dagrun/dagrun"
)

// tracerProvider builds the OpenTelemetry tracer provider the standard
// OTEL_* variables ask for, or nil when tracing is off: it is on when
// OTEL_TRACES_EXPORTER names otlp or console (a comma-separated list may
// name both), or is unset while an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT), and
// never under OTEL_SDK_DISABLED=true. OTLP goes over HTTP with protobuf,
// or gRPC (OTEL_EXPORTER_OTLP_PROTOCOL=grpc); the exporter reads its
// endpoint, headers and timeout from the same variables, the SDK its
// sampler (OTEL_TRACES_SAMPLER) and batching (OTEL_BSP_*), the resource
// OTEL_SERVICE_NAME (default dagrun) and OTEL_RESOURCE_ATTRIBUTES.
//
// A setting it cannot follow (an exporter or protocol dagrun does not
// have, an endpoint the exporter refuses) is logged as a warning and
// leaves that exporter out, as the SDK does with a sampler it does not
// know: telemetry settings shared by a fleet's environment never stop a
// command from doing its work.
func (c *cli) tracerProvider(ctx context.Context) *sdktrace.TracerProvider {
	if strings.EqualFold(c.io.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil
	}
	names := traceExporterNames(c.io.Getenv)
	if len(names) == 0 {
		return nil
	}
	// The SDK reports what goes wrong later (a batch it could not send, a
	// sampler setting it ignored) to a global handler, which writes plain
	// lines to stderr: they go through the CLI's logger instead, in its
	// format.
	logger := c.logger
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing", slog.Any("error", err))
	}))
	var options []sdktrace.TracerProviderOption
	for _, name := range names {
		var (
			exp sdktrace.SpanExporter
			err error
		)
		switch name {
		case "console":
			// The spans as JSON on stderr, for a look without a collector:
			// stdout carries the commands' own output (an instance's JSON).
			exp, err = stdouttrace.New(stdouttrace.WithWriter(c.io.Stderr))
		case "otlp":
			exp, err = c.otlpExporter(ctx)
		default:
			err = fmt.Errorf("OTEL_TRACES_EXPORTER names %q, which dagrun does not have (it has otlp, console and none)", name)
		}
		if err != nil {
			logger.Warn("tracing: spans are not exported to "+name, slog.Any("error", err))
			continue
		}
		options = append(options, sdktrace.WithBatcher(exp))
	}
	if len(options) == 0 {
		return nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("dagrun")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		// The resource keeps what it could read.
		logger.Warn("tracing: resource attributes", slog.Any("error", err), slog.String("check", "OTEL_RESOURCE_ATTRIBUTES"))
	}
	if res == nil {
		res = resource.Default()
	}
	options = append(options,
		sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()))
	return sdktrace.NewTracerProvider(options...)
}

// traceExporterNames reads OTEL_TRACES_EXPORTER as the specification
// writes it: a comma-separated list, "none" for no exporter, and otlp
// when it is unset but an OTLP endpoint is set.
func traceExporterNames(getenv func(string) string) []string {
	var names []string
	for _, name := range strings.Split(getenv("OTEL_TRACES_EXPORTER"), ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "none" {
			return nil
		}
		if name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if len(names) == 0 && (getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "") {
		names = []string{"otlp"}
	}
	return names
}

// otlpExporter is the OTLP exporter the OTEL_EXPORTER_OTLP_* variables
// describe: over HTTP with protobuf unless the protocol is grpc. Go's
// OpenTelemetry has no http/json exporter; such a setting sends protobuf
// to the same endpoint, which OTLP/HTTP receivers take too.
func (c *cli) otlpExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	variable := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	protocol := c.io.Getenv(variable)
	if protocol == "" {
		variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
		protocol = c.io.Getenv(variable)
	}
	switch strings.TrimSpace(protocol) {
	case "grpc":
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("OTLP over gRPC: %v (check the OTEL_EXPORTER_OTLP_* variables)", err)
		}
		return exp, nil
	case "http/json":
		c.logger.Warn("tracing: " + variable + "=http/json: spans go as http/protobuf, which OTLP/HTTP receivers take too")
	case "", "http/protobuf":
	default:
		return nil, fmt.Errorf("%s=%q is not an OTLP protocol dagrun has: use http/protobuf or grpc", variable, protocol)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP over HTTP: %v (check the OTEL_EXPORTER_OTLP_* variables)", err)
	}
	return exp, nil
}
