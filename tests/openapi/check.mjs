// Checks an OpenAPI 3.1 contract of idemsaga's, and a running service against it.
//
//   node check.mjs --spec docs/openapi/orchestrator.json
//       validates the document (a real OpenAPI 3.1 validator).
//   node check.mjs --url http://127.0.0.1:8080 --bearer tenantApiKey=dev-key-demo ...
//       reads the served /openapi.json, validates it, then sends every documented operation
//       its documented example (path parameters, required query parameters, headers, body,
//       credentials by security scheme), and the same request without credentials, with a
//       body that is not JSON and with the example plus a field no schema has; every answer
//       must have a documented status, content type and required headers, a JSON body must
//       validate against the documented schema, and the last three must be refused (4xx).
//       It sends real requests that change data (orders, charges, faults): point it at a
//       stack you can throw away.
//
// Prints one JSON line ({"documents", "requests", "results", "failures"}) and exits 1 on any
// failure. Operations run POSTs before GETs, in document order, so that an example key that a
// POST creates is there for the GET that reads it.
import { Validator } from "@seriousme/openapi-schema-validator";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { readFile } from "node:fs/promises";

const args = process.argv.slice(2);
const opt = { specs: [], bearer: {}, url: "" };
for (let i = 0; i < args.length; i += 2) {
  const [flag, value] = [args[i], args[i + 1]];
  if (flag === "--spec") opt.specs.push(value);
  else if (flag === "--url") opt.url = value.replace(/\/$/, "");
  else if (flag === "--bearer") {
    const at = value.indexOf("=");
    opt.bearer[value.slice(0, at)] = value.slice(at + 1);
  } else throw new Error("unknown flag " + flag);
}

const failures = [];
const results = [];
const fail = (where, what) => failures.push(where + ": " + what);

async function validateDocument(doc, where) {
  const result = await new Validator().validate(doc);
  if (!result.valid) fail(where, "not a valid OpenAPI 3.1 document: " + JSON.stringify(result.errors).slice(0, 2000));
  if (doc.openapi !== "3.1.0") fail(where, "openapi must be 3.1.0, is " + doc.openapi);
}

const pointer = (...parts) => "#/" + parts.map((p) => String(p).replace(/~/g, "~0").replace(/\//g, "~1")).join("/");
const mediaType = (header) => (header || "").split(";")[0].trim().toLowerCase();
const isJson = (type) => type === "application/json" || type.endsWith("+json");

function deref(doc, node) {
  while (node && node.$ref) {
    node = node.$ref.slice(2).split("/").map((p) => p.replace(/~1/g, "/").replace(/~0/g, "~"))
      .reduce((n, p) => n[p], doc);
  }
  return node;
}

async function conformance(doc) {
  // Strict: a keyword Ajv does not know (a typo such as `minimun`) is an error, not a no-op;
  // OpenAPI's own schema keywords are declared, and the document's top-level fields (the
  // document is added whole so that its $refs resolve).
  const ajv = new Ajv2020({ strict: true, strictTypes: false, strictRequired: false, allErrors: true, validateSchema: false });
  for (const keyword of ["example", "discriminator", "xml", "externalDocs", "openapi", "info", "paths",
                         "components", "tags", "security", "servers", "webhooks", "jsonSchemaDialect"]) {
    ajv.addKeyword(keyword);
  }
  addFormats(ajv);
  ajv.addSchema(doc, "openapi.json");
  const operations = [];
  for (const [path, item] of Object.entries(doc.paths || {})) {
    for (const method of ["get", "put", "post", "delete", "patch"]) {
      if (item[method]) operations.push({ path, method, op: item[method], shared: item.parameters || [] });
    }
  }
  operations.sort((a, b) => (a.method === "post" ? 0 : 1) - (b.method === "post" ? 0 : 1));

  async function send({ path, method, op, shared }, variant) {
    const where = method.toUpperCase() + " " + path + (variant === "example" ? "" : " (" + variant + ")");
    let target = path;
    const query = new URLSearchParams();
    const headers = {};
    for (const p of [...shared, ...(op.parameters || [])].map((x) => deref(doc, x))) {
      const example = p.example ?? p.schema?.example;
      if (p.in === "path") {
        if (example === undefined) return fail(where, "path parameter " + p.name + " has no example");
        target = target.replace("{" + p.name + "}", encodeURIComponent(String(example)));
      } else if (p.in === "query" && (p.required || example !== undefined) && variant === "example") {
        if (example === undefined) return fail(where, "required query parameter " + p.name + " has no example");
        query.set(p.name, String(example));
      } else if (p.in === "header" && (p.required || example !== undefined)) {
        if (example === undefined) return fail(where, "required header " + p.name + " has no example");
        headers[p.name] = String(example);
      }
    }
    const security = op.security ?? doc.security ?? [];
    const scheme = security.length ? Object.keys(security[0])[0] : undefined;
    if (scheme && variant !== "no credentials") {
      if (!(scheme in opt.bearer)) return fail(where, "no --bearer given for security scheme " + scheme);
      headers.Authorization = "Bearer " + opt.bearer[scheme];
    }
    let body;
    const bodySpec = deref(doc, op.requestBody);
    if (bodySpec) {
      const json = bodySpec.content?.["application/json"];
      if (!json || json.example === undefined) return fail(where, "request body has no application/json example");
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(json.example);
      if (variant === "not JSON") body = '{"idemsaga_no_such_field": [';
      if (variant === "unknown field") body = JSON.stringify({ ...json.example, idemsaga_no_such_field: 1 });
    }
    const qs = query.toString();
    const url = opt.url + target + (qs ? "?" + qs : "");
    let res;
    try {
      res = await fetch(url, { method: method.toUpperCase(), headers, body, redirect: "manual",
                               signal: AbortSignal.timeout(20000) });
    } catch (e) {
      return fail(where, "request failed: " + e.message);
    }
    const text = await res.text();
    results.push({ method: method.toUpperCase(), path, variant, status: res.status });
    const documented = op.responses?.[String(res.status)];
    if (!documented) return fail(where, "answered " + res.status + ", not documented: " + text.slice(0, 300));
    const response = deref(doc, documented);
    for (const [name, header] of Object.entries(response.headers || {})) {
      if (deref(doc, header).required && !res.headers.has(name)) fail(where, res.status + " lacks the required header " + name);
    }
    const type = mediaType(res.headers.get("content-type"));
    if (!response.content) {
      if (text.length) fail(where, res.status + " documents no body, got " + type + ": " + text.slice(0, 200));
      return;
    }
    const pathsPointer = pointer("paths", path, method, "responses", String(res.status));
    const responsePointer = documented.$ref ? documented.$ref : pathsPointer;
    if (!response.content[type]) {
      return fail(where, res.status + " answered " + type + ", documented " + Object.keys(response.content).join(", "));
    }
    if (variant !== "example" && res.status < 400) fail(where, "accepted a request it must refuse (" + res.status + ")");
    if (!isJson(type) || !response.content[type].schema) return;
    let parsed;
    try {
      parsed = JSON.parse(text);
    } catch {
      return fail(where, res.status + " " + type + " body is not JSON: " + text.slice(0, 200));
    }
    const validate = ajv.compile({ $ref: "openapi.json" + responsePointer + "/content/" + type.replace(/\//g, "~1") + "/schema" });
    if (!validate(parsed)) {
      fail(where, res.status + " body does not match its schema: " + ajv.errorsText(validate.errors) + " in " + text.slice(0, 300));
    }
  }

  for (const o of operations) {
    await send(o, "example");
    const security = o.op.security ?? doc.security ?? [];
    if (security.length && Object.keys(security[0]).length) await send(o, "no credentials");
    const example = deref(doc, o.op.requestBody)?.content?.["application/json"]?.example;
    if (o.op.requestBody) await send(o, "not JSON");
    // Every body refuses a field it does not know, but where the operation says it ignores
    // them (`x-unknown-fields: ignored`: the OTLP intake, as OTLP/JSON requires).
    if (example && typeof example === "object" && !Array.isArray(example) && o.op["x-unknown-fields"] !== "ignored") {
      await send(o, "unknown field");
    }
  }
  return operations.length;
}

const documents = [];
for (const file of opt.specs) {
  const doc = JSON.parse(await readFile(file, "utf8"));
  await validateDocument(doc, file);
  documents.push(file);
}
let operations = 0;
if (opt.url) {
  const res = await fetch(opt.url + "/openapi.json");
  if (res.status !== 200) fail("GET /openapi.json", "answered " + res.status);
  else {
    const doc = await res.json();
    await validateDocument(doc, opt.url + "/openapi.json");
    documents.push(opt.url + "/openapi.json");
    operations = await conformance(doc);
  }
}
console.log(JSON.stringify({ documents, operations, requests: results.length, results, failures }));
process.exit(failures.length ? 1 : 0);
