package dag

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// keywordValue says what a JSON Schema keyword's value is, so that the
// keyword check looks for keywords only where a schema is.
type keywordValue int

const (
	keywordData         keywordValue = iota // a value, never a schema (type, required, const...)
	keywordSchema                           // one schema (not, items in 2020-12, additionalProperties...)
	keywordSchemas                          // a list of schemas (allOf, prefixItems...)
	keywordSchemaMap                        // names to schemas (properties, $defs...)
	keywordSchemaOrList                     // a schema or a list of them (items, before 2020-12)
	keywordDependencies                     // names to a schema or a list of names (dependencies)
)

// schemaKeywords are the keywords of JSON Schema drafts 4 to 2020-12,
// which a workflow's schemas may declare with $schema.
var schemaKeywords = map[string]keywordValue{
	// Core.
	"$schema": keywordData, "$id": keywordData, "id": keywordData, "$ref": keywordData,
	"$anchor": keywordData, "$dynamicRef": keywordData, "$dynamicAnchor": keywordData,
	"$recursiveRef": keywordData, "$recursiveAnchor": keywordData, "$vocabulary": keywordData,
	"$comment": keywordData, "$defs": keywordSchemaMap, "definitions": keywordSchemaMap,
	// Applicators.
	"allOf": keywordSchemas, "anyOf": keywordSchemas, "oneOf": keywordSchemas, "not": keywordSchema,
	"if": keywordSchema, "then": keywordSchema, "else": keywordSchema,
	"dependentSchemas": keywordSchemaMap, "dependencies": keywordDependencies,
	"prefixItems": keywordSchemas, "items": keywordSchemaOrList, "additionalItems": keywordSchema,
	"contains": keywordSchema, "properties": keywordSchemaMap, "patternProperties": keywordSchemaMap,
	"additionalProperties": keywordSchema, "propertyNames": keywordSchema,
	"unevaluatedItems": keywordSchema, "unevaluatedProperties": keywordSchema,
	// Validation.
	"type": keywordData, "enum": keywordData, "const": keywordData,
	"multipleOf": keywordData, "maximum": keywordData, "exclusiveMaximum": keywordData,
	"minimum": keywordData, "exclusiveMinimum": keywordData,
	"maxLength": keywordData, "minLength": keywordData, "pattern": keywordData,
	"maxItems": keywordData, "minItems": keywordData, "uniqueItems": keywordData,
	"maxContains": keywordData, "minContains": keywordData,
	"maxProperties": keywordData, "minProperties": keywordData,
	"required": keywordData, "dependentRequired": keywordData,
	// Annotations, format and content.
	"title": keywordData, "description": keywordData, "default": keywordData,
	"deprecated": keywordData, "readOnly": keywordData, "writeOnly": keywordData,
	"examples": keywordData, "format": keywordData,
	"contentEncoding": keywordData, "contentMediaType": keywordData, "contentSchema": keywordSchema,
}

// keywordNames are schemaKeywords' names, for suggestions.
var keywordNames = slices.Sorted(maps.Keys(schemaKeywords))

// checkKeywords reports every key of a schema (v, the schema converted to
// JSON; ptr its pointer) that no draft of JSON Schema defines, at the key.
// A validator ignores a keyword it does not know, so a misspelt one
// (requried, propertes) would turn its check off without a word, as Ajv's
// strict mode refuses it for. A keyword of the user's own starts with "x-",
// as OpenAPI's extensions do. It reports whether there was none.
func (p *parser) checkKeywords(v any, ptr string, nodes map[string]*yaml.Node, what string) bool {
	schema, isMap := v.(map[string]any)
	if !isMap {
		return true // a boolean schema, or a mistake the compiler reports
	}
	ok := true
	for _, k := range slices.Sorted(maps.Keys(schema)) {
		at := ptr + "/" + escapePointer(k)
		kind, known := schemaKeywords[k]
		if !known {
			if strings.HasPrefix(k, "x-") {
				continue
			}
			p.c.at(keyNode(nodes[ptr], k), "%s at %s: %s", what, displayPointer(at), unknownKeyword(k))
			ok = false
			continue
		}
		switch value := schema[k]; kind {
		case keywordSchema:
			ok = p.checkKeywords(value, at, nodes, what) && ok
		case keywordSchemas, keywordSchemaOrList:
			if list, isList := value.([]any); isList {
				for i, s := range list {
					ok = p.checkKeywords(s, at+"/"+strconv.Itoa(i), nodes, what) && ok
				}
			} else if kind == keywordSchemaOrList {
				ok = p.checkKeywords(value, at, nodes, what) && ok
			}
		case keywordSchemaMap, keywordDependencies:
			if named, isNamed := value.(map[string]any); isNamed {
				for _, name := range slices.Sorted(maps.Keys(named)) {
					ok = p.checkKeywords(named[name], at+"/"+escapePointer(name), nodes, what) && ok
				}
			}
		}
	}
	return ok
}

// unknownKeyword says what to write instead of an unknown keyword.
func unknownKeyword(k string) string {
	if k == "nullable" {
		return `unknown keyword "nullable" (it is OpenAPI 3.0's, not JSON Schema's: allow null with type: [string, "null"])`
	}
	msg := fmt.Sprintf("unknown keyword %q", k)
	if s := suggest(k, keywordNames); s != "" {
		return msg + fmt.Sprintf(" (did you mean %q?)", s)
	}
	return msg + `: a keyword of your own must start with "x-"`
}

// keyNode finds the key node of k in a mapping node, or the mapping.
func keyNode(mapping *yaml.Node, k string) *yaml.Node {
	if mapping == nil || mapping.Kind != yaml.MappingNode {
		return mapping
	}
	for i := 0; i+1 < len(mapping.Content); i += 2 {
		if mapping.Content[i].Value == k {
			return mapping.Content[i]
		}
	}
	return mapping
}
