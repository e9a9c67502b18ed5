#!/usr/bin/env node
// Writes the tokenizer test corpus (one JSON string per line) to stdout:
//   node scripts/js/make_corpus.mjs > tests/fixtures/tokenizer/corpus.jsonl
// Deterministic; edit the lists below to change the corpus, then regenerate
// the id fixtures (see tests/fixtures/tokenizer/README.md).
const C = [];
const add = (...xs) => C.push(...xs);

// --- special strings -----------------------------------------------------
add("", " ", "  ", "\t", "\n", "a", "A", "0", ".", "\u0000", "\u007f");

// --- English prose --------------------------------------------------------
add(
  "Hello world",
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
  "I don't think I'll go; you're sure he'd've liked it? We've seen they'll won't can't.",
  "DON'T SHOUT. I'LL WHISPER. It's John's book, not the Smiths' car.",
  "She said, \"It's fine.\" He replied: 'Is it, though?'",
  "\u201cSmart quotes\u201d and \u2018single smart quotes\u2019 \u2014 with an em dash \u2013 and an en dash.",
  "Wait... what?!?! No way!!! (Really??) [Yes.] {Sure}",
  "Ellipsis\u2026 and more\u2026\u2026",
  "end of sentence.Next sentence without space.And another",
  "Mr. Smith vs. Dr. Jones, e.g. i.e. etc.",
  "a-b a--b a---b a_b a__b snake_case_name kebab-case-name CamelCaseName lowerCamelCase",
  "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
  "In 1969, Neil Armstrong became the first person to walk on the Moon; the mission was Apollo 11.",
  "  leading two spaces",
  "trailing two spaces  ",
  " leading and trailing ",
  "The word 'tokenization' is tokenized into sub-word units.",
  "!!!???...,,,;;;:::",
  "-- --- ---- ===== ***** ##### ~~~~~ ^^^^^ _____",
  "'s 't 're 've 'm 'll 'd",
  "x's y'S Z'LL o'clock rock'n'roll",
  "#hashtag @mention $100 50% 3&4 a|b a\\b a/b",
  "?!abc .abc ,abc \"abc 'abc (abc [abc {abc <abc",
  "Hello\u00a0world with NBSP",
);

// --- source code ------------------------------------------------------------
add(
  "#include <vector>\n\nint main() {\n    std::vector<int> v{1, 2, 3};\n    for (auto& x : v) x *= 2;\n    return 0;\n}\n",
  "template <typename T>\nconstexpr T clamp(T x, T lo, T hi) noexcept { return x < lo ? lo : (hi < x ? hi : x); }",
  "a+=b; a-=b; a*=b; a/=b; a%=b; a<<=1; a>>=1; a&&b; a||b; !a; a!=b; a==b; a<=b; a>=b; a<=>b; p->q; a::b; x++; --y;",
  "if (x == nullptr) { throw std::runtime_error(\"null\"); }",
  "\tif (a) {\n\t\tb();\n\t}\n",
  "struct Foo {\n\tint a;\t// tab-separated comment\n\tfloat b;\n};",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "class A(B):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, *args, **kwargs) -> None:\n        super().__init__(*args, **kwargs)\n",
  "print(f\"{x!r:>10} {y:.3f} {z=}\")",
  "lambda x: [i**2 for i in range(x) if i % 2 == 0]",
  "{\"name\": \"fanout\", \"version\": \"0.1.0\", \"deps\": [\"a\", \"b\"], \"n\": 12345, \"ok\": true, \"nil\": null}",
  "{\n  \"model\": \"deepseek-v3\",\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"hi\"}\n  ],\n  \"temperature\": 0.7\n}",
  "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | tr a-z A-Z > \"${f%.txt}.out\"; done\n",
  "ls -la | grep -v '^d' | awk '{print $9}' 2>/dev/null && cd ~/src || exit 1",
  "export PATH=\"$HOME/.local/bin:$PATH\"; cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j$(nproc)",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC LIMIT 10;",
  "<html><body><div class=\"x\" id='y'>Hello &amp; goodbye</div></body></html>",
  "fn main() { let v: Vec<u8> = vec![0xff; 16]; println!(\"{:?}\", v); }",
  "const f = async (a, b) => { await g?.(a ?? b); return `${a}-${b}`; };",
  "x=1;y=2;z=x+y",
  "    \n        \n",
  "\t\t\t\t",
  "if x:\n\tpass\n  \tmixed\n",
  "0x7fffffff 0b1010 0o777 1e-9 6.02e23 3.14159f 42ULL",
  "// comment\n/* block\n   comment */\n# hash comment\n-- sql comment",
  "a[i][j] = b[i-1][j+1] * c[(i+j)%n];",
  "std::unordered_map<std::string, std::vector<std::pair<int, double>>> m;",
);

// --- CJK ---------------------------------------------------------------------
add(
  "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
  "\u6df1\u5ea6\u6c42\u7d22\u662f\u4e00\u5bb6\u4eba\u5de5\u667a\u80fd\u516c\u53f8\u3002",
  "\u6211\u4eec\u5728\u5317\u4eac\u5927\u5b66\u5b66\u4e60\u81ea\u7136\u8bed\u8a00\u5904\u7406\uff0c\u4eca\u5929\u662f2024\u5e7412\u670826\u65e5\u3002",
  "\u4e2d\u6587English\u6df7\u5408mixed\u6587\u672c",
  "\u3010\u6807\u9898\u3011\u300a\u4e66\u540d\u300b\u201c\u5f15\u53f7\u201d\uff08\u62ec\u53f7\uff09\u3001\uff1b\uff1a\uff1f\uff01",
  "\u9f98\u9f99\u9f9f\u9fa5\u9fa6\u9fff",                    // around the end of [\u4e00-\u9fa5]
  "\u4e00\u4e01\u4e02 \u4dff\u3400\u3401",                    // start of range, CJK ext A (outside)
  "\ud840\udc00\ud840\udc01\ud869\uded6",                    // U+20000.. CJK ext B (outside, astral)
  "\ud87a\udff0\ud87a\udff1",                                // U+2EBF0 CJK ext I (Unicode 15.1)
  "\u3105\u3106\u3107\u3108 \u6ce8\u97f3\u7b26\u53f7",        // bopomofo
  "\uf900\uf901\ufa0e \u2f00\u2f01 \u31c0",                  // compatibility ideographs, radicals, strokes
  "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\uff01",
  "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3068\u6f22\u5b57\u3092\u6df7\u305c\u305f\u6587\u7ae0\u3067\u3059\u3002",
  "\u30b3\u30f3\u30d4\u30e5\u30fc\u30bf\u30fc\u30fb\u30b5\u30a4\u30a8\u30f3\u30b9\u30fc\u30fc",
  "\uff76\uff80\uff76\uff85 \uff8a\uff9d\uff76\uff78",        // half-width katakana
  "\u3041\u3094\u309f\u30a0\u30ff\u309b\u309c",              // hiragana/katakana block edges
  "\uc548\ub155\ud558\uc138\uc694, \uc138\uacc4! \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
  "\u1100\u1161\u11a8 \u3131\u314f",                          // conjoining jamo, compatibility jamo
  "\u6771\u4eac\u30bf\u30ef\u30fc\u306f333m\u3067\u3059",
  "\u5168\u89d2\u30b9\u30da\u30fc\u30b9\u3000\u3042\u308a\u3000\u3000\u4e8c\u3064",
  "\u8fd9\u662f\u4e00\u4e2a\u5f88\u957f\u7684\u4e2d\u6587\u53e5\u5b50\uff0c\u7528\u6765\u6d4b\u8bd5\u5206\u8bcd\u5668\u5728\u5904\u7406\u8fde\u7eed\u6c49\u5b57\u65f6\u7684\u884c\u4e3a\uff0c\u5305\u62ec\u6807\u70b9\u7b26\u53f7\u548c\u6570\u5b57123\u4ee5\u53ca\u82f1\u6587word\u3002",
  "\u7e41\u9ad4\u4e2d\u6587\uff1a\u81fa\u7063\u3001\u9999\u6e2f\u3001\u6fb3\u9580\u3002",
);

// --- emoji -------------------------------------------------------------------
add(
  "\ud83d\ude00\ud83d\ude03\ud83d\ude04",
  "I \u2764\ufe0f Unicode \ud83c\udf89\ud83c\udf89",
  "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 family",
  "\ud83d\udc69\u200d\ud83d\udcbb\ud83e\uddd1\u200d\ud83d\ude80\ud83c\udff3\ufe0f\u200d\ud83c\udf08",
  "\ud83d\udc4d\ud83c\udffb\ud83d\udc4d\ud83c\udffc\ud83d\udc4d\ud83c\udffd\ud83d\udc4d\ud83c\udffe\ud83d\udc4d\ud83c\udfff",
  "\ud83c\uddfa\ud83c\uddf8\ud83c\uddef\ud83c\uddf5\ud83c\udde8\ud83c\uddf3\ud83c\uddec\ud83c\udde7",
  "\ud83c\udff4\udb40\udc67\udb40\udc62\udb40\udc73\udb40\udc63\udb40\udc74\udb40\udc7f Scotland tag sequence",
  "1\ufe0f\u20e3 #\ufe0f\u20e3 keycaps",
  "emoji\ud83d\ude80inside\ud83d\ude80words",
  "\u263a \u263a\ufe0f \u263a\ufe0e text vs emoji presentation",
  "\ud83e\udee0\ud83e\udef6\ud83e\udeb7",                   // newer emoji (14/15)
);

// --- digits ----------------------------------------------------------------
add(
  "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
  "3.14159", "0.001", "-42", "+7", "1,000,000", "1_000_000", "1e10", "2024-12-26", "12:34:56",
  "abc123def4567ghi", "x1y22z333w4444", "v1.2.3-rc4", "H2O CO2 C6H12O6",
  "\uff10\uff11\uff12\uff13\uff14\uff15", "\u0660\u0661\u0662\u0663\u0664", "\u06f1\u06f2\u06f3\u06f4",
  "\u0966\u0967\u0968\u0969", "\u2460\u2461\u2462 \u00bd \u00b2\u00b3 \u2155 \u2167",
  "\ud835\udfce\ud835\udfcf\ud835\udfd0",                      // mathematical bold digits (astral Nd)
  "Call 555-0123 or +1 (800) 555-0199.",
  "Pi is approximately 3.14159265358979323846264338327950288419716939937510.",
  "99 bottles, 98 bottles, 100 bottles, 1000 bottles, 10000 bottles",
);

// --- whitespace --------------------------------------------------------------
add(
  "a b", "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a \tb", "a\t b",
  "a\nb", "a\r\nb", "a\rb", "a\n\nb", "a\n\n\nb", "a\r\n\r\nb", "a \nb", "a\n b", "a \n b",
  "line1\nline2\n", "\nleading newline", "trailing newline\n", "\n\n\n", "\r\n", "\r\n\r\n",
  "   ", "    ", "        ", "\t\t", " \t \t ", "  \n  \n  ", "line\n    \n    \nline",
  "word   ", "   word", "a\u000bb\u000cc", "a\u0085b", "a\u2028b\u2029c", "a\u3000b", "a\u2003b\u2009c\u200ad",
  "x \u00a0 y", "x\ufeff y", "x \ufeffy", " \ufeff ", "\u1680\u180e\u202f\u205f",
  // JS \s (has U+FEFF, lacks U+0085) != Oniguruma \s: these split differently
  // unless common.mjs patches the regex (see README).
  "  \ufeff  x", " \u0085 ", "c \u0085x", "abc \u0085\t", "a \u200a\ufeff<|EOT|>", "\t\t\ufeff",
  "x\u00a0 \u0085y", "\u3000 \u0085\u205f\ufeff", "123\r \u00a0\u0085\u1680 \nz",
);

// --- special tokens in text -----------------------------------------------------
add(
  "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
  "<\uff5cbegin\u2581of\u2581sentence\uff5c>Hello",
  "<\uff5cUser\uff5c>What is 2+2?<\uff5cAssistant\uff5c>4<\uff5cend\u2581of\u2581sentence\uff5c>",
  "text <\uff5cUser\uff5c> text <\uff5cAssistant\uff5c> text",
  "<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cend\u2581of\u2581sentence\uff5c>",
  "a<\uff5cUser\uff5c>b",
  " <\uff5cUser\uff5c> ",
  "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function<\uff5ctool\u2581sep\uff5c>get_weather\n```json\n{\"city\": \"Paris\"}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>",
  "<\uff5ctool\u2581outputs\u2581begin\uff5c><\uff5ctool\u2581output\u2581begin\uff5c>{\"temp\": 21}<\uff5ctool\u2581output\u2581end\uff5c><\uff5ctool\u2581outputs\u2581end\uff5c>",
  "<\uff5cfim\u2581begin\uff5c>def f():<\uff5cfim\u2581hole\uff5c>return 1<\uff5cfim\u2581end\uff5c>",
  "<\uff5c\u2581pad\u2581\uff5c><|EOT|><\uff5cplace\u2581holder\u2581no\u25811\uff5c><\uff5cplace\u2581holder\u2581no\u258110\uff5c>",
  "<\uff5cUser|>",                                          // near miss: ASCII bar at end
  "<|User\uff5c>",
  "<|User|> <|Assistant|> <|begin_of_sentence|> <|endoftext|>",
  "<\uff5cuser\uff5c>",                                      // wrong case
  "<\uff5cbegin of sentence\uff5c>",                         // spaces instead of U+2581
  "<\uff5cbegin\u2581of\u2581sentence\uff5c",                // missing '>'
  "\uff5cbegin\u2581of\u2581sentence\uff5c>",                // missing '<'
  "<<\uff5cUser\uff5c>>",
  "<\uff5cUser\uff5c><\uff5cUser\uff5c><\uff5cUser\uff5c>",
  "\u2581\u2581word\u2581with\u2581lower\u2581one\u2581eighth\u2581blocks",
  "<think>\nreasoning\n</think>\n\nanswer",
);

// --- mixed scripts ------------------------------------------------------------------
add(
  "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.",
  "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5! \u03b1\u03b2\u03b3\u03b4\u03b5",
  "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645! \u0647\u0630\u0627 \u0627\u062e\u062a\u0628\u0627\u0631.",
  "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd! \u05d6\u05d4 \u05de\u05d1\u05d7\u05df.",
  "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e! \u092f\u0939 \u090f\u0915 \u092a\u0930\u0940\u0915\u094d\u0937\u0923 \u0939\u0948\u0964",
  "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01 \u0e19\u0e35\u0e48\u0e04\u0e37\u0e2d\u0e01\u0e32\u0e23\u0e17\u0e14\u0e2a\u0e2d\u0e1a",
  "English \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22 \u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4",
  "mixedWord\u0421\u043b\u043e\u0432\u043e\u03bb\u03cc\u03b3\u03bf\u03c2",
  "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u0570\u0561\u0575\u0565\u0580\u0565\u0576 \u12a0\u121b\u122d\u129b \u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u0c24\u0c46\u0c32\u0c41\u0c17\u0c41 \u1019\u103c\u1014\u103a\u1019\u102c",
  "Stra\u00dfe \u00fcber \u00e4rger \u00f6l \u00c6\u00d8\u00c5 \u0153uvre \u0131stanbul \u0130STANBUL",
  "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 123 \u0645\u0639 English \u0648\u0623\u0631\u0642\u0627\u0645",
);

// --- combining marks --------------------------------------------------------------
add(
  "e\u0301 vs \u00e9",
  "cafe\u0301 cafe\u0301s re\u0301sume\u0301",
  "Ti\u1ebfng Vi\u1ec7t c\u00f3 nhi\u1ec1u d\u1ea5u: \u0111\u01b0\u1eddng, ng\u01b0\u1eddi, Vi\u1ec7t Nam",
  "Tie\u0302\u0301ng Vie\u0323\u0302t (decomposed)",
  "a\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308",
  "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
  "\u0301leading combining mark",
  " \u0301 space then combining",
  "\u0915\u093f \u0915\u094d\u0937 \u0e01\u0e34\u0e4a",
  "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd with niqqud",
  "\ud835\udc00\ud835\udc01\ud835\udc02 mathematical bold",
);

// --- rare unicode ----------------------------------------------------------------
add(
  "\ufffd", "bad\ufffdbyte", "zero\u200bwidth\u200bspace", "\ufeffBOM at start", "soft\u00adhyphen",
  "private\ue000use\uf8ff", "\udb80\udc00 supplementary private use", "a\u200cb\u200dc", "\u2060word\u2060joiner",
  "left\u200eto\u200fright \u202aembed\u202c", "\u0001\u0002\u0003\u001b[31mred\u001b[0m", "\ufff9\ufffa\ufffb",
  "\u00a0", "\u00ad", "\u200b", "\ufeff",
  "\u2126 \u212b \u2160 \ufb01 \ufb00 ligatures",
  "\u3300\u3301 \u337b \u32ff squared",
  "\ud800\udc00 Linear B \ud80c\udc00 hieroglyph",
  "\u{1f600}".repeat(3) + "\u{e0001}",
);

// --- long words, URLs, emails, math, markdown ----------------------------------------
add(
  "Supercalifragilisticexpialidocious antidisestablishmentarianism",
  "pneumonoultramicroscopicsilicovolcanoconiosis",
  "a".repeat(300),
  "ab".repeat(150),
  "\u4e2d".repeat(200),
  "\ud83d\ude00".repeat(50),
  "x".repeat(100) + " " + "y".repeat(100),
  "Donaudampfschifffahrtselektrizit\u00e4tenhauptbetriebswerkbauunterbeamtengesellschaft",
  " ".repeat(64) + "deep indent",
  "=".repeat(80),
  "https://github.com/deepseek-ai/DeepSeek-V3/blob/main/README.md?tab=readme-ov-file#introduction",
  "http://example.com:8080/path/to/file.html?a=1&b=2%20c#frag",
  "Visit www.example.org or ftp://files.example.net/pub/file.tar.gz today.",
  "user.name+tag@example.co.uk, first.last@sub.domain.io; <admin@localhost>",
  "mailto:someone@example.com?subject=Hi%20there",
  "\u2200x \u2208 \u211d, \u2203y: x\u00b2 + y\u00b2 \u2264 1 \u21d2 |x| \u2264 1",
  "\u222b\u2080^\u221e e^{-x\u00b2} dx = \u221a\u03c0/2, \u2211_{n=1}^{\u221e} 1/n\u00b2 = \u03c0\u00b2/6",
  "$E = mc^2$ and $$\\frac{a}{b} + \\sqrt{x^2 + y^2} \\leq \\int_0^1 f(t)\\,dt$$",
  "a\u00d7b\u00f7c \u00b1 d \u2260 e \u2248 f \u2261 g \u2282 h \u222a i \u2229 j \u2205",
  "# Heading 1\n## Heading 2\n\n- item one\n- item two\n  - nested\n\n1. first\n2. second\n",
  "**bold** _italic_ `code` ~~strike~~ [link](https://example.com) ![img](a.png)",
  "```python\nprint('hi')\n```\n",
  "| a | b |\n|---|---|\n| 1 | 2 |\n",
  "> quote line\n> another\n\n---\n\n* bullet",
  "Table:\tcol1\tcol2\n\tval1\tval2",
);

// --- pre-tokenizer edge cases ------------------------------------------------------------
add(
  "!abc", "!!abc", "!ABC123", ".NET", "#define X", "@Override", "$var", "'quoted'", "\"dq\"",
  "a.b.c", "a,b,c", "a;b;c", "(a)(b)", "a(b)c", "..a", "__init__", "--flag=value", "-n", "/usr/bin",
  "\u00bfQu\u00e9? \u00a1S\u00ed!", "\u2018a\u2019 \u201cb\u201d \u00abc\u00bb \u2039d\u203a",
  "\u3002\u3001\uff01\u4f60", "\uff01abc", "\u3001\u4e2d", "\u2014\u2014\u4e2d\u6587", "\u2026\u2026\u4e2d",
  "$$$$$", "%%%%%", "  !!", " !!\n", " !!\r\n\r\n", "!!\n\n", "a!\n", "?\n\n\nx",
  "\u00a9 2024 \u00ae \u2122 \u00a7 \u00b6 \u2020 \u2021 \u00b0C \u20ac100 \u00a350 \u00a5300 \u20b9 \u20bf",
  "\u2190\u2191\u2192\u2193 \u21d0\u21d2 \u2500\u2502\u250c\u2510 \u2588\u2591\u2592\u2593 \u25cf\u25cb\u25a0\u25a1",
  "a1", "1a", "a 1", "1 a", " 1", "1 ", "\u4e001", "1\u4e00", "\u4e00a", "a\u4e00", "\u3042a", "a\u30a2",
  "A\u0301B", "\u0301\u0301\u0301", "x\u0308\u0304y",
);

// --- longer mixed passages ---------------------------------------------------------------
add(
  "DeepSeek-V3 is a strong Mixture-of-Experts (MoE) language model with 671B total parameters with 37B activated for each token. To achieve efficient inference and cost-effective training, DeepSeek-V3 adopts Multi-head Latent Attention (MLA) and DeepSeekMoE architectures.",
  "User: Translate \"good morning\" into Chinese, Japanese and Korean.\nAssistant: \u65e9\u4e0a\u597d / \u304a\u306f\u3088\u3046\u3054\u3056\u3044\u307e\u3059 / \uc88b\uc740 \uc544\uce68\uc785\ub2c8\ub2e4",
  "Error: std::bad_alloc at 0x7ffd5e3c (line 42)\n  in fanout::kv::Cache::grow(size_t=1048576)\n  in main\n",
  "TODO(alice): fix off-by-one in [0, n) \u2192 [0, n]; see #1234 & PR !56.",
  "\u7b2c1\u7ae0\uff1a\u5f00\u59cb\n\n\u300c\u4f60\u597d\u300d\uff0c\u5979\u8bf4\u3002\u201cHello\u201d, he replied.\n\n\u7b2c2\u7ae0\uff1a\u7ed3\u675f",
  "JSON in prose: {\"a\":[1,2,{\"b\":null}]} then \\n literal backslash-n and \\t tab.",
  "C:\\Users\\Admin\\Documents\\file (1).txt",
  "/* \u4e2d\u6587\u6ce8\u91ca */ int \u53d8\u91cf = 42; // \u65e5\u672c\u8a9e\u30b3\u30e1\u30f3\u30c8",
);

// De-duplicate while keeping order.
const seen = new Set();
const out = C.filter((s) => (seen.has(s) ? false : (seen.add(s), true)));
for (const s of out) {
  if (/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s))
    throw new Error(`lone surrogate in corpus entry ${JSON.stringify(s)}`);
}
process.stdout.write(out.map((s) => JSON.stringify(s) + "\n").join(""));
