#!/usr/bin/env python3
# The public API size from rustdoc HTML: `cargo doc --no-deps --all-features`,
# then `python3 bench/scripts/api_size.py` (CHANGELOG quotes it).
import glob,re,sys,os
d=sys.argv[1] if len(sys.argv)>1 else 'target/doc/keyed_rate_limit'
pages={}
for f in glob.glob(d+'/**/*.html',recursive=True):
    b=os.path.basename(f)
    if not re.match(r'(struct|enum|trait|type|union)\.',b): continue
    h=open(f).read()
    cut=h.find('id="trait-implementations"')
    if cut<0: cut=h.find('id="synthetic-implementations"')
    inh=h[:cut] if cut>0 else h
    n=len(set(re.findall(r'id="(?:method|tymethod)\.([a-z_0-9]+)"',inh)))
    pages.setdefault(b,n)   # an item documented at two paths counts once
idx=open(d+'/index.html').read()
root=len(set(re.findall(r'id="reexport\.([A-Za-z_]+)"',idx)))
print(f"distinct public types={len(pages)} inherent methods={sum(pages.values())} root re-exports={root}")
