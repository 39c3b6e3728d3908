#!/usr/bin/env python3
"""Fails unless the installed headers under PREFIX/include are exactly idemsaga's public ones:
only include/idemsaga/**.hpp, none including an internal header, httplib or Boost, and every
declaration in them inside namespace idemsaga.
  check_headers.py PREFIX [SOURCE_DIR]   (with SOURCE_DIR: the same set as include/idemsaga/)"""
import os, re, sys

ALLOWED_SYSTEM = re.compile(r'^(nlohmann/json\.hpp|pqxx/pqxx|[a-z_]+)$')  # <string>, <pqxx/pqxx>

def strip(text):
    text = re.sub(r'//[^\n]*', '', text)
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)

def problems(path, rel):
    out = []
    text = open(path).read()
    for m in re.finditer(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', text, re.M):
        target = m.group(2)
        if target.startswith('idemsaga/'):
            continue
        if m.group(1) == '"' or not ALLOWED_SYSTEM.match(target):
            out.append(f'{rel}: includes {target}')
    code = strip(text)
    depth, i, ns_stack = 0, 0, []
    for line in code.split('\n'):
        s = line.strip()
        if not s or s.startswith('#'):
            continue
        if depth == 0:
            m = re.match(r'namespace\s+([\w:]+)\s*\{', s)
            if not m or not m.group(1).split('::')[0] == 'idemsaga':
                out.append(f'{rel}: outside namespace idemsaga: {s[:60]}')
                break
        depth += s.count('{') - s.count('}')
    return out

def main():
    prefix = sys.argv[1]
    include = os.path.join(prefix, 'include')
    found, errors = set(), []
    for root, _, files in os.walk(include):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), include)
            if not rel.startswith('idemsaga/') or not rel.endswith('.hpp'):
                errors.append(f'not a public header: include/{rel}')
                continue
            found.add(rel)
            errors += problems(os.path.join(root, f), rel)
    if len(sys.argv) > 2:
        src = os.path.join(sys.argv[2], 'include')
        expected = {os.path.relpath(os.path.join(r, f), src)
                    for r, _, fs in os.walk(src) for f in fs if f.endswith('.hpp')}
        for missing in sorted(expected - found):
            errors.append(f'not installed: include/{missing}')
    for e in errors:
        print('check_headers:', e)
    print(f'check_headers: {len(found)} public headers, {len(errors)} problems')
    return 1 if errors or not found else 0

if __name__ == '__main__':
    sys.exit(main())
