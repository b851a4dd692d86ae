package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/dagrun/dagrun"
)

// tracerProvider builds the OpenTelemetry tracer provider the standard
// OTEL_* variables ask for, or nil when tracing is off: it is on when
// OTEL_TRACES_EXPORTER is otlp or console, or unset while an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT), and
// never under OTEL_SDK_DISABLED=true. Spans go over OTLP/HTTP with protobuf;
// the exporter reads its endpoint, headers and timeout from the same
// variables, the SDK its sampler (OTEL_TRACES_SAMPLER) and batching
// (OTEL_BSP_*), the resource OTEL_SERVICE_NAME (default dagrun) and
// OTEL_RESOURCE_ATTRIBUTES.
func (c *cli) tracerProvider(ctx context.Context) (*sdktrace.TracerProvider, error) {
	if strings.EqualFold(c.io.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	exporter := strings.TrimSpace(c.io.Getenv("OTEL_TRACES_EXPORTER"))
	switch exporter {
	case "none":
		return nil, nil
	case "":
		if c.io.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && c.io.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
			return nil, nil
		}
	case "otlp", "console":
	default:
		return nil, usageError(fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: use otlp, console or none", exporter))
	}
	// The SDK reports what goes wrong later (a batch it could not send, a
	// sampler setting it ignored) to a global handler, which writes plain
	// lines to stderr: they go through the CLI's logger instead, in its
	// format.
	logger := c.logger
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing", slog.Any("error", err))
	}))
	var (
		exp sdktrace.SpanExporter
		err error
	)
	if exporter == "console" {
		// The spans as JSON on stderr, for a look without a collector:
		// stdout carries the commands' own output (an instance's JSON).
		if exp, err = stdouttrace.New(stdouttrace.WithWriter(c.io.Stderr)); err != nil {
			return nil, usageError(fmt.Errorf("tracing: console exporter: %v", err))
		}
	} else if exp, err = c.otlpExporter(ctx); err != nil {
		return nil, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("dagrun")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, usageError(fmt.Errorf("tracing: resource: %v (check OTEL_RESOURCE_ATTRIBUTES)", err))
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(dagrun.TraceIDGenerator()),
	), nil
}

// otlpExporter is the OTLP/HTTP exporter the OTEL_EXPORTER_OTLP_*
// variables describe.
func (c *cli) otlpExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	protocol := c.io.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = c.io.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if protocol != "" && protocol != "http/protobuf" {
		return nil, usageError(fmt.Errorf("OTLP protocol %q is not supported: use http/protobuf (set OTEL_EXPORTER_OTLP_PROTOCOL)", protocol))
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, usageError(fmt.Errorf("tracing: OTLP exporter: %v (check the OTEL_EXPORTER_OTLP_* variables)", err))
	}
	return exp, nil
}
