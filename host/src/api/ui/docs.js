// The API reference at /docs: reads /openapi.json and shows every route (by tag) and
// every schema. Text from the document goes into the page as text only.

const METHODS = ['get', 'put', 'post', 'patch', 'delete'];

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const refName = (ref) => ref.replace('#/components/schemas/', '');

// A schema as a short line: links to named schemas, enums, lists, unions.
function typeOf(schema) {
  if (!schema || Object.keys(schema).length === 0 || (schema.description && Object.keys(schema).length === 1)) {
    return [h('span', { class: 'muted' }, 'any JSON')];
  }
  if (schema.$ref) {
    const name = refName(schema.$ref);
    return [h('a', { href: `#schema-${name}` }, name)];
  }
  for (const key of ['oneOf', 'anyOf', 'allOf']) {
    if (Array.isArray(schema[key])) {
      const parts = schema[key].map(typeOf);
      const out = [];
      parts.forEach((p, i) => { if (i) out.push(key === 'allOf' ? ' & ' : ' | '); out.push(...p); });
      return out;
    }
  }
  if (Array.isArray(schema.enum)) return [schema.enum.map((v) => JSON.stringify(v)).join(' | ')];
  const types = [].concat(schema.type || []);
  const out = [];
  types.forEach((t, i) => {
    if (i) out.push(' | ');
    if (t === 'array') out.push('list of ', ...typeOf(schema.items || {}));
    else if (t === 'object' && schema.additionalProperties && typeof schema.additionalProperties === 'object') {
      out.push('map of ', ...typeOf(schema.additionalProperties));
    } else out.push(t);
  });
  return out.length ? out : [h('span', { class: 'muted' }, 'any JSON')];
}

function propertiesTable(schema) {
  const props = schema.properties || {};
  const required = new Set(schema.required || []);
  const rows = Object.entries(props).map(([name, p]) => h('tr', {},
    h('td', {}, h('code', {}, name), required.has(name) ? ' (required)' : ''),
    h('td', {}, ...typeOf(p)),
    h('td', { class: 'text' }, p.description || '')));
  if (!rows.length) return null;
  return h('table', {}, h('tr', {}, h('th', {}, 'field'), h('th', {}, 'type'), h('th', {}, 'meaning')), rows);
}

function operation(path, method, op) {
  const params = (op.parameters || []).map((p) => h('tr', {},
    h('td', {}, h('code', {}, p.name), ` (${p.in}${p.required ? ', required' : ''})`),
    h('td', {}, ...typeOf(p.schema || {})),
    h('td', { class: 'text' }, p.description || '')));
  const body = op.requestBody;
  const responses = Object.entries(op.responses || {}).map(([status, r]) => {
    const content = r.content || {};
    const types = Object.entries(content).map(([type, c]) => h('span', {}, `${type}: `, ...typeOf(c.schema || {})));
    return h('tr', {}, h('td', {}, status), h('td', { class: 'text' }, r.description || ''), h('td', {}, types));
  });
  return h('details', { id: `op-${op.operationId || method + path}` },
    h('summary', {}, h('span', { class: `method ${method}` }, method.toUpperCase()), ' ',
      h('span', { class: 'path' }, path), ' ', h('span', { class: 'muted' }, (op.summary || '').split('\n')[0])),
    h('div', {},
      op.description ? h('p', { class: 'text' }, op.description) : null,
      params.length ? [h('h4', {}, 'Parameters'), h('table', {}, params)] : null,
      body ? [h('h4', {}, 'Body'), h('p', { class: 'text' }, body.description || ''),
        h('p', {}, Object.entries(body.content || {}).map(([type, c]) => h('span', {}, `${type}: `, ...typeOf(c.schema || {}), ' ')))] : null,
      h('h4', {}, 'Answers'), h('table', {}, h('tr', {}, h('th', {}, 'status'), h('th', {}, 'meaning'), h('th', {}, 'body')), responses)));
}

function schemaSection(name, schema) {
  return h('section', { class: 'schema', id: `schema-${name}` },
    h('h3', {}, name),
    schema.description ? h('p', { class: 'text' }, schema.description) : null,
    schema.properties ? propertiesTable(schema) : h('p', {}, ...typeOf(schema)));
}

async function main() {
  const main = document.getElementById('doc');
  const toc = document.getElementById('toc');
  let doc;
  try {
    const response = await fetch('openapi.json');
    if (!response.ok) throw new Error(`GET /openapi.json answered ${response.status}`);
    doc = await response.json();
  } catch (e) {
    main.replaceChildren(h('p', {}, `The document could not be read: ${e.message}`));
    return;
  }
  const parts = [h('p', { class: 'text' }, doc.info?.description || '')];
  for (const tag of doc.tags || []) {
    const ops = [];
    for (const [path, item] of Object.entries(doc.paths || {})) {
      for (const method of METHODS) {
        const op = item[method];
        if (op && (op.tags || []).includes(tag.name)) ops.push(operation(path, method, op));
      }
    }
    parts.push(h('h2', { id: `tag-${tag.name}` }, tag.name), h('p', { class: 'muted' }, tag.description || ''), ops);
    toc.append(h('a', { href: `#tag-${tag.name}` }, tag.name));
  }
  parts.push(h('h2', { id: 'schemas' }, 'Schemas'));
  toc.append(h('a', { href: '#schemas' }, 'schemas'));
  for (const [name, schema] of Object.entries(doc.components?.schemas || {})) parts.push(schemaSection(name, schema));
  main.replaceChildren(...parts.flat());
}

main();
