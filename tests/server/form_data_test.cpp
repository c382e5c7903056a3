// Copyright TileMaxSim authors. multipart/form-data parsing (server/form_data.h) on one table of
// well-formed and broken bodies.
#include "server/form_data.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tms::server {
namespace {

struct FormCase {
    const char* what;
    std::string content_type;
    std::string body;
    std::string error;                    // "" when the body parses
    std::vector<std::string> parts = {};  // name=data of each part, when it parses
};

TEST(FormDataCpu, ParsesFormsAndRefusesBrokenOnes) {
    const std::string ct = "multipart/form-data; boundary=b0";
    const std::string a = "Content-Disposition: form-data; name=\"a\"\r\n";
    const std::vector<FormCase> cases = {
        {"two parts",
         ct,
         "--b0\r\n" + a +
             "\r\nx\r\n--b0\r\nContent-Disposition: form-data; name=b; filename=\"f.npy\"\r\n"
             "Content-Type: application/x-npy\r\n\r\n\r\n-b0\r\n\r\n--b0--\r\n",
         "",
         {"a=x", "b=\r\n-b0\r\n"}},
        {"binary with CR LF and dashes",
         ct,
         "--b0\r\n" + a + "\r\n" + std::string("\x93\r\n--b\0--b0x", 12) + "\r\n--b0--",
         "",
         {"a=" + std::string("\x93\r\n--b\0--b0x", 12)}},
        {"quoted boundary, preamble, padding",
         "Multipart/Form-Data; charset=utf-8; boundary=\"q b\"",
         "ignored\r\n--q b \t\r\n" + a + "\r\n1\r\n--q b--",
         "",
         {"a=1"}},
        {"empty part", ct, "--b0\r\n" + a + "\r\n\r\n--b0--", "", {"a="}},
        {"not a form", "application/json", "{}", "not multipart/form-data"},
        {"no boundary", "multipart/form-data", "--b0\r\n", "boundary"},
        {"boundary over 70", "multipart/form-data; boundary=" + std::string(71, 'x'), "", "boundary"},
        {"unclosed quote in boundary", "multipart/form-data; boundary=\"b0", "", "boundary"},
        {"body without the boundary", ct, "hello", "does not start"},
        {"boundary inside a line", ct, "x--b0\r\n" + a + "\r\n1\r\n--b0--", "does not start"},
        {"no parts", ct, "--b0--", "no parts"},
        {"truncated", ct, "--b0\r\n" + a + "\r\n12345", "never closes"},
        {"headers never end", ct, "--b0\r\n" + a, "never closes"},
        {"boundary line not ended", ct, "--b0x\r\n" + a + "\r\n1\r\n--b0--", "CRLF"},
        {"no headers", ct, "--b0\r\n\r\n1\r\n--b0--", "Content-Disposition"},
        {"no name", ct, "--b0\r\nContent-Disposition: form-data\r\n\r\n1\r\n--b0--", "Content-Disposition"},
        {"not form-data", ct, "--b0\r\nContent-Disposition: attachment; name=a\r\n\r\n1\r\n--b0--", "not form-data"},
        {"header without colon", ct, "--b0\r\n" + a + "junk\r\n\r\n1\r\n--b0--", "without ':'"},
        {"name quote never closes", ct, "--b0\r\nContent-Disposition: form-data; name=\"a\r\n\r\n1\r\n--b0--", "quote"},
        {"two parts alike", ct, "--b0\r\n" + a + "\r\n1\r\n--b0\r\n" + a + "\r\n2\r\n--b0--", "two parts named 'a'"},
    };
    for (const FormCase& c : cases) {
        std::vector<FormPart> parts;
        const Status st = ParseFormData(c.content_type, c.body, &parts);
        if (c.error.empty()) {
            ASSERT_TRUE(st.ok()) << c.what << ": " << st.message();
            std::vector<std::string> got;
            for (const FormPart& p : parts) got.push_back(p.name + "=" + std::string(p.data));
            EXPECT_EQ(got, c.parts) << c.what;
        } else {
            EXPECT_FALSE(st.ok()) << c.what;
            EXPECT_NE(st.message().find(c.error), std::string::npos) << c.what << ": " << st.message();
            EXPECT_EQ(st.message().find('\n'), std::string::npos) << c.what;
        }
    }
    // More parts than a form may hold.
    std::string many = "--b0";
    for (size_t i = 0; i <= kMaxFormParts; ++i) {
        many += "\r\nContent-Disposition: form-data; name=p" + std::to_string(i) + "\r\n\r\nv\r\n--b0";
    }
    std::vector<FormPart> parts;
    const Status st = ParseFormData(ct, many + "--", &parts);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("more than"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace tms::server
